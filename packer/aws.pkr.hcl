# AWS GPU image: an amazon-ebs source on Ubuntu 22.04 or 24.04 (Canonical's
# AMIs), provisioned by the same ansible/image.yml as the local image, with the
# builder in the groups that switch the GPU stack on. clusterbake selects it with
# -only=amazon-ebs.ubuntu (src/clusterbake/images/aws.py); its steps are the
# cloud images' build (cloud.pkr.hcl); packer/README.md says how Packer versions
# are handled.
#
# This file must stay loadable by Packer 1.6.6 (Debian's, which validates it
# here): settings that only the amazon plugin knows (IMDSv2, ed25519 key pairs)
# live in packer/plugins/amazon-ebs.plugin-settings.hcl and are inserted at the
# marker in the source block for Packer >= 1.10 builds.

variable "aws_region" {
  type        = string
  default     = "us-east-1"
  description = "Region the builder runs in and the AMI is registered in."
}

variable "aws_base" {
  type        = string
  default     = "ubuntu-24.04"
  description = "Base OS: ubuntu-22.04 or ubuntu-24.04 (Canonical's newest AMI of that release)."

  validation {
    condition     = contains(["ubuntu-22.04", "ubuntu-24.04"], var.aws_base)
    error_message = "The aws_base variable must be ubuntu-22.04 or ubuntu-24.04."
  }
}

# A GPU type, so that the driver, DCGM and NCCL are checked on a real GPU in the
# build (validate_gpu): g5.xlarge (1 x A10G, Ampere, the open kernel modules'
# generation range) is the cheapest widely available one. The AMI runs on every
# GPU type the driver supports (Turing and newer: g4dn, g5, g6, p4d, p5 ...).
variable "aws_builder_instance_type" {
  type        = string
  default     = "g5.xlarge"
  description = "Instance type of the builder; a GPU type unless validate_gpu is false."
}

variable "aws_volume_size_gb" {
  type        = number
  default     = 100
  description = "Root volume (and AMI snapshot) size in GiB; the CUDA toolkit alone takes about 8."
}

variable "aws_volume_encrypted" {
  type        = bool
  default     = true
  description = "Encrypt the root volume, hence the AMI's snapshot."
}

variable "aws_kms_key_id" {
  type        = string
  default     = ""
  description = "KMS key for the encrypted volume; empty for the account's default EBS key."
}

variable "aws_subnet_id" {
  type        = string
  default     = ""
  description = "Subnet of the builder; empty for the default VPC."
}

variable "aws_ssh_interface" {
  type        = string
  default     = "public_ip"
  description = "How Packer and Ansible reach the builder: public_ip, private_ip, public_dns, private_dns."
}

variable "aws_ansible_groups" {
  type        = list(string)
  default     = ["slurm_head", "slurm_compute", "cuda", "nvswitch", "efa", "dcgm", "lustre", "s3"]
  description = "Inventory groups of the builder: they switch components on (features as groups)."
}

variable "validate_efa" {
  type        = bool
  default     = false
  description = "The builder has an EFA interface (an EFA type launched with one): check fi_info -p efa in the build."
}

locals {
  aws_artifacts_dir = var.artifacts_dir != "" ? var.artifacts_dir : "${local.repo_root}/build/packer-aws"

  # Canonical's (owner 099720108685) amd64 server AMIs; 24.04 images are gp3 only.
  ubuntu_ami_names = {
    "ubuntu-22.04" = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
    "ubuntu-24.04" = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
  }

  aws_image_tags = {
    "Name"                        = var.image_name
    "clusterbake:image"           = var.image_name
    "clusterbake:base"            = var.aws_base
    "clusterbake:git-revision"    = var.git_revision
    "clusterbake:versions-digest" = var.versions_digest
    "clusterbake:source-ami"      = "{{ .SourceAMI }}"
  }

  # What the cloud images' build (cloud.pkr.hcl) takes for this source: the login user,
  # the builder's groups, its own validation switch (no EFA on the builder), where the
  # artifacts go and what the manifest adds.
  aws_build = {
    ssh_user       = "ubuntu"
    ansible_groups = var.aws_ansible_groups
    validation     = { efa_validate = var.validate_efa }
    artifacts_dir  = local.aws_artifacts_dir
    manifest       = { aws_base = var.aws_base, region = var.aws_region }
  }
}

source "amazon-ebs" "ubuntu" {
  region          = var.aws_region
  instance_type   = var.aws_builder_instance_type
  ami_name        = var.image_name
  ami_description = "clusterbake ${var.aws_base} GPU image ${var.image_name} (git ${var.git_revision})"
  ena_support     = true
  sriov_support   = true

  source_ami_filter {
    filters = {
      name                = local.ubuntu_ami_names[var.aws_base]
      architecture        = "x86_64"
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    owners      = ["099720108685"]
    most_recent = true
  }

  subnet_id     = var.aws_subnet_id
  ssh_interface = var.aws_ssh_interface
  ssh_username  = "ubuntu"
  ssh_timeout   = "10m"
  # The temporary key leaves the image with the builder.
  ssh_clear_authorized_keys = true

  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = var.aws_volume_size_gb
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 125
    encrypted             = var.aws_volume_encrypted
    kms_key_id            = var.aws_kms_key_id
    delete_on_termination = true
  }

  # clusterbake:plugin-settings (packer/plugins/amazon-ebs.plugin-settings.hcl)

  tags          = local.aws_image_tags
  snapshot_tags = local.aws_image_tags
  run_tags = {
    "Name"              = "clusterbake-builder ${var.image_name}"
    "clusterbake:image" = var.image_name
  }
  run_volume_tags = {
    "Name"              = "clusterbake-builder ${var.image_name}"
    "clusterbake:image" = var.image_name
  }
}
