# The plugins the templates need with Packer >= 1.10 (`packer init packer/plugins`),
# where amazon-ebs, azure-arm and ansible are no longer built in. Packer 1.6.6 rejects this
# block, so it lives apart and clusterbake passes it only to newer Packers
# (packer/README.md). Versions are exact: a plugin runs with the builder's
# cloud credentials, so a new release is taken on purpose (bump here, build,
# review), never by `packer init` on its own.
packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = "= 1.3.10"
    }
    azure = {
      source  = "github.com/hashicorp/azure"
      version = "= 2.6.4"
    }
    ansible = {
      source  = "github.com/hashicorp/ansible"
      version = "= 1.1.5"
    }
  }
}
