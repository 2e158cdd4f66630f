# The cloud images' build: one sequence of steps for amazon-ebs.ubuntu (aws.pkr.hcl) and
# azure-arm.ubuntu (azure.pkr.hcl), each source's values from its template's
# local.<cloud>_build; clusterbake builds one with -only=<source>. The local image
# (local.pkr.hcl) is provisioned by the same ansible/image.yml in a build of its own.

locals {
  # The GPU roles' checks need a GPU on the builder (validate_gpu); each cloud adds its own.
  gpu_validation = {
    nvidia_driver_validate = var.validate_gpu
    nccl_validate          = var.validate_gpu
    dcgm_validate          = var.validate_gpu
  }
  cloud_build = {
    "amazon-ebs" = local.aws_build
    "azure-arm"  = local.azure_build
  }
}

build {
  sources = ["source.amazon-ebs.ubuntu", "source.azure-arm.ubuntu"]

  # cloud-init and the first apt-daily runs hold apt's lock on a fresh machine.
  provisioner "shell" {
    inline = [
      "sudo cloud-init status --wait > /dev/null || [ $? -eq 2 ]",
      "sudo systemctl stop apt-daily.timer apt-daily-upgrade.timer unattended-upgrades.service || true",
    ]
  }

  provisioner "ansible" {
    playbook_file = "${local.repo_root}/ansible/image.yml"
    command       = var.ansible_playbook_command
    user          = local.cloud_build[source.type].ssh_user
    use_proxy     = false
    groups        = local.cloud_build[source.type].ansible_groups
    extra_arguments = [
      "--become",
      "--extra-vars", "@${var.image_vars_file}",
      "--extra-vars", jsonencode(merge(local.gpu_validation, local.cloud_build[source.type].validation)),
    ]
    ansible_env_vars = ["ANSIBLE_CONFIG=${local.repo_root}/ansible/ansible.cfg", "ANSIBLE_HOST_KEY_CHECKING=False"]
  }

  # What the image holds, next to the manifest: clusterbake records it.
  provisioner "file" {
    direction   = "download"
    source      = "/opt/clusterbake/versions.json"
    destination = "${local.cloud_build[source.type].artifacts_dir}/versions.json"
  }

  # Per-instance state must not ship: cloud-init reruns, a new machine-id.
  provisioner "shell" {
    inline = [
      "sudo apt-get clean",
      "sudo cloud-init clean --logs",
      "sudo truncate -s 0 /etc/machine-id",
    ]
  }

  # Azure's generalization of a Linux image, last: the agent removes the build user, its key
  # and itself, so Packer does not clean up after this script.
  provisioner "shell" {
    only       = ["azure-arm.ubuntu"]
    inline     = ["sudo /usr/sbin/waagent -force -deprovision+user && export HISTSIZE=0 && sync"]
    skip_clean = true
  }

  post-processor "manifest" {
    output     = "${local.cloud_build[source.type].artifacts_dir}/packer-manifest.json"
    strip_path = true
    custom_data = merge(
      { image_name = var.image_name, git_revision = var.git_revision, versions_digest = var.versions_digest },
      local.cloud_build[source.type].manifest,
    )
  }
}
