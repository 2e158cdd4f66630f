# Azure GPU image: an azure-arm source on Canonical's Ubuntu 24.04 (offer
# ubuntu-24_04-lts, sku server: Gen2, what the ND/NC GPU sizes boot), provisioned
# by the same ansible/image.yml as the local and AWS images, with the builder in
# the groups that switch the Azure stack on (azure, doca_ofed, amlfs, blobfuse2,
# and the NVIDIA roles shared with AWS). The result is a managed image, and, when
# azure_gallery_name is set, also a version of an existing Azure Compute Gallery
# image definition. clusterbake selects it with -only=azure-arm.ubuntu
# (src/clusterbake/images/azure.py); packer/README.md says how Packer versions
# are handled.
#
# This file must stay loadable by Packer 1.6.6 (Debian's, which validates it here,
# with the azure-arm builder it bundles): no plugin-only settings.

variable "azure_subscription_id" {
  type        = string
  default     = ""
  description = "Subscription the builder VM runs in and the image is stored in."
}

variable "azure_tenant_id" {
  type        = string
  default     = ""
  description = "Tenant of the service principal; empty: found from the subscription."
}

variable "azure_client_id" {
  type        = string
  default     = ""
  description = "Service principal (app id) Packer authenticates as; empty: Azure CLI login or managed identity."
}

# Never on the command line: clusterbake passes it as PKR_VAR_azure_client_secret.
variable "azure_client_secret" {
  type        = string
  default     = ""
  sensitive   = true
  description = "Secret of azure_client_id."
}

variable "azure_use_cli_auth" {
  type        = bool
  default     = false
  description = "Authenticate as the Azure CLI's logged-in user (az login) instead of a service principal."
}

variable "azure_location" {
  type        = string
  default     = "eastus"
  description = "Region of the builder VM and the managed image (the cluster's azure.location)."
}

variable "azure_resource_group" {
  type        = string
  default     = "clusterbake-images"
  description = "Existing resource group the managed image is stored in."
}

variable "azure_build_resource_group" {
  type        = string
  default     = ""
  description = "Existing resource group for the builder VM; empty: Packer creates a temporary one in azure_location."
}

# A GPU size, so that the driver, DCGM and NCCL are checked on a real GPU in the
# build (validate_gpu): Standard_NC4as_T4_v3 (1 x T4, Turing, the oldest
# generation the open kernel modules support) is the cheapest widely available
# one. The image runs on every GPU size the driver supports (NCasT4_v3, NC A100
# v4, ND A100 v4, ND H100/H200 v5).
variable "azure_vm_size" {
  type        = string
  default     = "Standard_NC4as_T4_v3"
  description = "VM size of the builder; a GPU size unless validate_gpu is false."
}

variable "azure_image_publisher" {
  type        = string
  default     = "Canonical"
  description = "Marketplace publisher of the base image."
}

variable "azure_image_offer" {
  type        = string
  default     = "ubuntu-24_04-lts"
  description = "Marketplace offer of the base image."
}

variable "azure_image_sku" {
  type        = string
  default     = "server"
  description = "Marketplace SKU of the base image (server: Gen2)."
}

variable "azure_image_version" {
  type        = string
  default     = "latest"
  description = "Marketplace version of the base image."
}

variable "azure_base" {
  type        = string
  default     = "ubuntu-24.04"
  description = "The base's name for clusterbake (tags, manifest): ubuntu-24.04 or ubuntu-22.04."
}

variable "azure_os_disk_size_gb" {
  type        = number
  default     = 100
  description = "OS disk (and image) size in GiB; the CUDA toolkit and DOCA-OFED take about 12."
}

variable "azure_virtual_network_name" {
  type        = string
  default     = ""
  description = "Existing virtual network of the builder; empty: Packer creates one (the builder gets a public IP)."
}

variable "azure_virtual_network_subnet_name" {
  type        = string
  default     = ""
  description = "Subnet of azure_virtual_network_name."
}

variable "azure_virtual_network_resource_group_name" {
  type        = string
  default     = ""
  description = "Resource group of azure_virtual_network_name; empty: Packer looks it up."
}

variable "azure_gallery_name" {
  type        = string
  default     = ""
  description = "Azure Compute Gallery to publish a version to as well; empty: the managed image only."
}

variable "azure_gallery_resource_group" {
  type        = string
  default     = ""
  description = "Resource group of azure_gallery_name; empty: azure_resource_group."
}

variable "azure_gallery_image_name" {
  type        = string
  default     = "clusterbake-ubuntu-24.04"
  description = "Existing image definition in the gallery (Linux, generalized, Gen2)."
}

variable "azure_gallery_image_version" {
  type        = string
  default     = "0.0.1"
  description = "Version to create (Major.Minor.Patch), chosen by clusterbake from the build time."
}

variable "azure_gallery_replication_regions" {
  type        = list(string)
  default     = []
  description = "Regions the gallery version is replicated to besides azure_location."
}

variable "azure_ansible_groups" {
  type        = list(string)
  default     = ["slurm_head", "slurm_compute", "azure", "cuda", "nvswitch", "dcgm", "doca_ofed", "amlfs", "blobfuse2"]
  description = "Inventory groups of the builder: they switch components on (features as groups)."
}

variable "validate_ib" {
  type        = bool
  default     = false
  description = "The builder has InfiniBand (an RDMA size): DOCA-OFED's check requires the ports to be up."
}

locals {
  azure_artifacts_dir      = var.artifacts_dir != "" ? var.artifacts_dir : "${local.repo_root}/build/packer-azure"
  azure_gallery_group      = var.azure_gallery_resource_group != "" ? var.azure_gallery_resource_group : var.azure_resource_group
  azure_ssh_username       = "packer"
  azure_gallery_publishing = var.azure_gallery_name != "" ? [var.azure_gallery_name] : []
  azure_gallery_regions    = distinct(concat([var.azure_location], var.azure_gallery_replication_regions))

  azure_image_tags = {
    "clusterbake-image"           = var.image_name
    "clusterbake-base"            = var.azure_base
    "clusterbake-git-revision"    = var.git_revision
    "clusterbake-versions-digest" = var.versions_digest
    "clusterbake-source-image"    = "${var.azure_image_publisher}:${var.azure_image_offer}:${var.azure_image_sku}:${var.azure_image_version}"
  }

  # What the cloud images' build (cloud.pkr.hcl) takes for this source: the login user, the
  # builder's groups, its own validation switch (no InfiniBand HCA on the builder), where the
  # artifacts go and what the manifest adds.
  azure_build = {
    ssh_user       = local.azure_ssh_username
    ansible_groups = var.azure_ansible_groups
    validation     = { doca_ofed_require_link = var.validate_ib }
    artifacts_dir  = local.azure_artifacts_dir
    manifest = {
      azure_base      = var.azure_base
      location        = var.azure_location
      resource_group  = var.azure_resource_group
      gallery_name    = var.azure_gallery_name
      gallery_group   = local.azure_gallery_group
      gallery_image   = var.azure_gallery_image_name
      gallery_version = var.azure_gallery_image_version
      subscription_id = var.azure_subscription_id
      gallery_regions = join(",", local.azure_gallery_regions)
    }
  }
}

source "azure-arm" "ubuntu" {
  subscription_id    = var.azure_subscription_id
  tenant_id          = var.azure_tenant_id != "" ? var.azure_tenant_id : null
  client_id          = var.azure_client_id != "" ? var.azure_client_id : null
  client_secret      = var.azure_client_secret != "" ? var.azure_client_secret : null
  use_azure_cli_auth = var.azure_use_cli_auth

  # Packer takes either a location (for its temporary resource group) or an existing group.
  location                  = var.azure_build_resource_group == "" ? var.azure_location : null
  build_resource_group_name = var.azure_build_resource_group != "" ? var.azure_build_resource_group : null
  vm_size                   = var.azure_vm_size

  os_type         = "Linux"
  image_publisher = var.azure_image_publisher
  image_offer     = var.azure_image_offer
  image_sku       = var.azure_image_sku
  image_version   = var.azure_image_version
  os_disk_size_gb = var.azure_os_disk_size_gb

  virtual_network_name                = var.azure_virtual_network_name != "" ? var.azure_virtual_network_name : null
  virtual_network_subnet_name         = var.azure_virtual_network_subnet_name != "" ? var.azure_virtual_network_subnet_name : null
  virtual_network_resource_group_name = var.azure_virtual_network_resource_group_name != "" ? var.azure_virtual_network_resource_group_name : null

  managed_image_name                = var.image_name
  managed_image_resource_group_name = var.azure_resource_group

  dynamic "shared_image_gallery_destination" {
    for_each = local.azure_gallery_publishing
    content {
      subscription        = var.azure_subscription_id
      resource_group      = local.azure_gallery_group
      gallery_name        = shared_image_gallery_destination.value
      image_name          = var.azure_gallery_image_name
      image_version       = var.azure_gallery_image_version
      replication_regions = local.azure_gallery_regions
    }
  }

  communicator = "ssh"
  ssh_username = local.azure_ssh_username
  ssh_timeout  = "15m"

  azure_tags = local.azure_image_tags
}
