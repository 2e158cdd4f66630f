  # Inserted by clusterbake into source "amazon-ebs" "ubuntu" of packer/aws.pkr.hcl
  # for Packer >= 1.10 with the amazon plugin (Packer 1.6.6 knows none of these).
  #
  # IMDSv2 only, on the builder and for every instance launched from the AMI.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  imds_support = "v2.0"

  # Ubuntu 22.04 and later refuse SHA-1 RSA signatures: an ed25519 temporary key.
  temporary_key_pair_type = "ed25519"
