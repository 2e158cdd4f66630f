"""The EC2 twin's metadata defaults (twins/aws/moto_ext.py) as EC2 documents them: an instance of
an AMI registered with ImdsSupport v2.0 gets HttpTokens=required and HttpPutResponseHopLimit=2
unless its launch says otherwise (moto alone: optional, 1). The product's templates pin 1
(tests/aws/test_cluster.py); this is what a launch that forgets would get."""

from __future__ import annotations


def _metadata_options(ec2, image_id: str, subnet_id: str, **launch) -> dict:
    instance = ec2.run_instances(ImageId=image_id, MinCount=1, MaxCount=1, InstanceType="t3.micro",
                                 SubnetId=subnet_id, **launch)["Instances"][0]  # fmt: skip
    try:
        described = ec2.describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"][0]["Instances"][0]
        return described["MetadataOptions"]
    finally:
        ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])


def test_an_imds_v2_ami_launches_with_ec2s_defaults_unless_the_launch_sets_them(moto, network):
    ec2 = moto.ec2()
    v2 = ec2.register_image(Name="cb-imds-v2", RootDeviceName="/dev/xvda", ImdsSupport="v2.0")["ImageId"]
    plain = ec2.register_image(Name="cb-imds-plain", RootDeviceName="/dev/xvda")["ImageId"]
    defaults = _metadata_options(ec2, v2, network.subnet_id)
    assert (defaults["HttpTokens"], defaults["HttpPutResponseHopLimit"]) == ("required", 2)
    pinned = _metadata_options(ec2, v2, network.subnet_id, MetadataOptions={"HttpPutResponseHopLimit": 1})
    assert (pinned["HttpTokens"], pinned["HttpPutResponseHopLimit"]) == ("required", 1)
    other = _metadata_options(ec2, plain, network.subnet_id)
    assert (other["HttpTokens"], other["HttpPutResponseHopLimit"]) == ("optional", 1)
