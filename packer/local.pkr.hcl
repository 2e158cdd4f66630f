# Local image: a null source whose SSH communicator reaches a builder node (a
# systemd-nspawn machine sharing the host's network, sshd on 127.0.0.1). The
# same ansible/image.yml provisions the amazon-ebs and azure-arm sources.

variable "builder_ssh_host" {
  type        = string
  default     = "127.0.0.1"
  description = "Address of the builder node's sshd."
}

variable "builder_ssh_port" {
  type        = number
  description = "Port of the builder node's sshd (a free port chosen by clusterbake)."
}

variable "builder_ssh_private_key_file" {
  type        = string
  description = "Private key the builder node authorizes for root."
}

variable "ansible_groups" {
  type        = list(string)
  default     = ["slurm_head", "slurm_compute"]
  description = "Inventory groups of the builder: they switch components on (features as groups)."
}

variable "ansible_tags" {
  type        = list(string)
  default     = []
  description = "Only the tasks of ansible/image.yml with these tags (and those tagged always); empty: all. A layer on a baked image runs the roles of the groups it adds (their tags)."
}

source "null" "local" {
  communicator         = "ssh"
  ssh_host             = var.builder_ssh_host
  ssh_port             = var.builder_ssh_port
  ssh_username         = "root"
  ssh_private_key_file = var.builder_ssh_private_key_file
  ssh_timeout          = "2m"
}

build {
  sources = ["source.null.local"]

  provisioner "ansible" {
    playbook_file    = "${path.root}/../ansible/image.yml"
    command          = var.ansible_playbook_command
    user             = "root"
    use_proxy        = false
    groups           = var.ansible_groups
    extra_arguments  = concat(["--extra-vars", "@${var.image_vars_file}"], length(var.ansible_tags) > 0 ? ["--tags", join(",", var.ansible_tags)] : [])
    ansible_env_vars = ["ANSIBLE_CONFIG=${path.root}/../ansible/ansible.cfg", "ANSIBLE_HOST_KEY_CHECKING=False"]
  }
}
