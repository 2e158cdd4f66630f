# Variables every source's ansible provisioner uses (local.pkr.hcl, aws.pkr.hcl).

variable "ansible_playbook_command" {
  type        = string
  default     = "ansible-playbook"
  description = "ansible-playbook from the project's venv."
}

variable "image_vars_file" {
  type        = string
  description = "YAML file of image-time variables (package pins, extra CA certificates)."
}
