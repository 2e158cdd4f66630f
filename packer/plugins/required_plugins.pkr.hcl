# The plugins the templates need with Packer >= 1.10 (`packer init packer/plugins`),
# where amazon-ebs, azure-arm and ansible are no longer built in. Packer 1.6.6 rejects this
# block, so it lives apart and clusterbake passes it only to newer Packers
# (packer/README.md).
packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
    azure = {
      source  = "github.com/hashicorp/azure"
      version = ">= 2.0.0"
    }
    ansible = {
      source  = "github.com/hashicorp/ansible"
      version = ">= 1.1.0"
    }
  }
}
