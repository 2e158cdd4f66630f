# Variables every source uses (local.pkr.hcl, aws.pkr.hcl, azure.pkr.hcl): the
# ansible provisioner's, and the cloud images' naming and artifacts. Defaults
# only let other sources and hand-run validations load the directory; clusterbake
# sets them (src/clusterbake/images/).

variable "ansible_playbook_command" {
  type        = string
  default     = "ansible-playbook"
  description = "ansible-playbook from the project's venv."
}

variable "image_vars_file" {
  type        = string
  description = "YAML file of image-time variables (package pins, extra CA certificates)."
}

variable "image_name" {
  type        = string
  default     = "clusterbake-unnamed"
  description = "Cloud image name (clusterbake-<base>-<date>-<git revision>), chosen by clusterbake."
}

variable "git_revision" {
  type        = string
  default     = "unknown"
  description = "Git revision of the playbooks and roles baked in."
}

variable "versions_digest" {
  type        = string
  default     = "unknown"
  description = "sha256 of ansible/group_vars/all/versions.yml, the GPU stack's version manifest."
}

variable "artifacts_dir" {
  type        = string
  default     = ""
  description = "Directory on the controller for the manifest post-processor's JSON and the image's versions.json; empty: build/packer-<cloud>."
}

variable "validate_gpu" {
  type        = bool
  default     = true
  description = "The cloud builder has an NVIDIA GPU: check nvidia-smi, DCGM and an all_reduce_perf run in the build."
}

variable "repo_root" {
  type        = string
  default     = ""
  description = "The clusterbake checkout; empty means the parent of this template's directory."
}

locals {
  repo_root = var.repo_root != "" ? var.repo_root : "${path.root}/.."
}
