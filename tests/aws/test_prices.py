"""Instance prices (prices.py), the cost estimate (billing.estimate) and, for what moto cannot
show, the leftovers check (billing.leftovers), with botocore's Stubber.

moto 5.2.5 serves neither price source as AWS does:
- the Price List Query API (`pricing` GetProducts) is not in moto at all: moto_server
  answers HTTP 500 with an HTML page (test_cost_guard.py shows `cluster status` saying
  "unknown" there);
- DescribeSpotPriceHistory answers a fixed "0.00001" for every type and zone with a 2006
  timestamp, and ignores ProductDescriptions, StartTime and EndTime.
So the exact requests (checked against botocore's models) and the parsing of AWS-shaped
answers are tested here. The GetProducts answers have the shape of AWS's own example
(botocore's pricing examples-1.json, GetProducts: each PriceList entry a JSON string with
`product`, `terms.OnDemand.<sku.offerTermCode>.priceDimensions.<rateCode>.pricePerUnit.USD`,
`publicationDate`); the spot answers that of EC2's example (botocore's ec2
examples-1.json, DescribeSpotPriceHistory). The prices in them are test values, not
AWS's prices. moto's FSx file systems have no Lifecycle, and moto never denies a call
without IAM authorization: the leftovers check of those is here too.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime

import botocore.session
import pytest
from botocore.stub import ANY, Stubber
from stubbed import ec2_client

from clusterbake.providers.aws import billing, prices
from clusterbake.providers.aws.prices import Price


@pytest.fixture(autouse=True)
def _fresh_cache():
    prices.clear_cache()
    yield
    prices.clear_cache()


def pricing_client():
    return botocore.session.get_session().create_client(
        "pricing", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def filters(instance_type: str, region: str) -> list[dict]:
    fields = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "licenseModel": "No License required",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def product(sku: str, instance_type: str, usd: str, published: str = "2025-06-01T18:22:01Z") -> str:
    """One PriceList entry as GetProducts returns it: a JSON document in a string."""
    term, rate = f"{sku}.JRTCKXETXF", f"{sku}.JRTCKXETXF.6YS6EN2CT7"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "servicecode": "AmazonEC2",
                    "instanceType": instance_type,
                    "location": "US East (N. Virginia)",
                    "locationType": "AWS Region",
                    "regionCode": "us-east-1",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "licenseModel": "No License required",
                    "capacitystatus": "Used",
                    "usagetype": f"BoxUsage:{instance_type}",
                    "operation": "RunInstances",
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    term: {
                        "priceDimensions": {
                            rate: {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                                "appliesTo": [],
                                "rateCode": rate,
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2025-06-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                },
                "Reserved": {
                    f"{sku}.4NA7Y494T4": {
                        "priceDimensions": {
                            f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": "1.0000000000"},
                                "rateCode": f"{sku}.4NA7Y494T4.6YS6EN2CT7",
                            }
                        },
                        "sku": sku,
                        "offerTermCode": "4NA7Y494T4",
                        "termAttributes": {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront"},
                    }
                },
            },
            "version": "20250601182201",
            "publicationDate": published,
        }
    )


def test_on_demand_sends_the_price_list_filters_and_reads_the_hourly_usd_price():
    pricing = pricing_client()
    with Stubber(pricing) as stub:
        stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": [product("AAAATESTSKU1", "p5.48xlarge", "12.3450000000")]},
            {"ServiceCode": "AmazonEC2", "Filters": filters("p5.48xlarge", "us-east-1"), "FormatVersion": "aws_v1"},
        )
        price = prices.on_demand(pricing, "us-east-1", "p5.48xlarge")
        # Asked once per process: the second answer comes from the cache (no request queued).
        assert prices.on_demand(pricing, "us-east-1", "p5.48xlarge") is price
        stub.assert_no_pending_responses()
    assert price == Price(12.345, "AWS Price List API, published 2025-06-01")  # the Reserved term is not read


def test_on_demand_follows_next_token_and_takes_the_highest_of_several_offers():
    pricing = pricing_client()
    request = {"ServiceCode": "AmazonEC2", "Filters": filters("c7i.large", "eu-central-1"), "FormatVersion": "aws_v1"}
    with Stubber(pricing) as stub:
        stub.add_response(
            "get_products",
            {"PriceList": [product("AAAATESTSKU2", "c7i.large", "0.1000000000")], "NextToken": "t1"},
            request,
        )
        stub.add_response(
            "get_products",
            {"PriceList": [product("AAAATESTSKU3", "c7i.large", "0.1500000000")]},
            {**request, "NextToken": "t1"},
        )
        price = prices.on_demand(pricing, "eu-central-1", "c7i.large")
    assert price.usd_per_hour == 0.15
    assert price.source == "AWS Price List API, published 2025-06-01, highest of 2 matching offers"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"PriceList": []}, "unknown: Price List GetProducts: no on-demand Linux price of p5.48xlarge in us-east-1"),
        (
            ("AccessDeniedException", "User is not authorized to perform: pricing:GetProducts"),
            "unknown: Price List GetProducts: AccessDeniedException: User is not authorized to perform: "
            "pricing:GetProducts",
        ),
        ({"PriceList": ["{not json"]}, "unknown: Price List GetProducts: unexpected answer (JSONDecodeError"),
    ],
)
def test_on_demand_that_cannot_be_had_is_unknown_with_the_reason(answer, expected):
    pricing = pricing_client()
    with Stubber(pricing) as stub:
        if isinstance(answer, tuple):
            stub.add_client_error("get_products", answer[0], answer[1], http_status_code=400)
        else:
            stub.add_response("get_products", answer)
        price = prices.on_demand(pricing, "us-east-1", "p5.48xlarge")
    assert price.usd_per_hour is None and not price.known
    assert price.source.startswith(expected)


def test_spot_asks_for_the_price_in_effect_now_in_the_zone():
    ec2 = ec2_client()
    history = [  # EC2 answers every zone's last change before StartTime, and the changes since
        {
            "AvailabilityZone": "us-east-1b",
            "InstanceType": "p5.48xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "9.000000",
            "Timestamp": datetime(2025, 6, 2, 4, 32, 53, tzinfo=UTC),
        },
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "p5.48xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "7.500000",
            "Timestamp": datetime(2025, 6, 1, 11, 28, 26, tzinfo=UTC),
        },
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "p5.48xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "8.250000",
            "Timestamp": datetime(2025, 6, 2, 1, 2, 3, tzinfo=UTC),
        },
    ]
    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {"SpotPriceHistory": history},
            {
                "InstanceTypes": ["p5.48xlarge"],
                "ProductDescriptions": ["Linux/UNIX"],
                "AvailabilityZone": "us-east-1a",
                "StartTime": ANY,
                "EndTime": ANY,
            },
        )
        price = prices.spot(ec2, "us-east-1a", "p5.48xlarge")
        assert prices.spot(ec2, "us-east-1a", "p5.48xlarge") is price  # cached
    assert price == Price(8.25, "EC2 spot price history, us-east-1a, since 2025-06-02 01:02 UTC")


def test_spot_request_times_are_now():
    ec2 = ec2_client()
    sent = {}
    ec2.meta.events.register(
        "provide-client-params.ec2.DescribeSpotPriceHistory", lambda params, **_: sent.update(params)
    )
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []})
        before = datetime.now(UTC)
        price = prices.spot(ec2, "us-east-1a", "c7i.large")
    assert before <= sent["StartTime"] == sent["EndTime"] <= datetime.now(UTC)
    assert price.source == "unknown: EC2 DescribeSpotPriceHistory: no spot price of c7i.large in us-east-1a"


def test_spot_without_permission_is_unknown():
    ec2 = ec2_client()
    with Stubber(ec2) as stub:
        stub.add_client_error(
            "describe_spot_price_history", "UnauthorizedOperation", "You are not authorized to perform this operation."
        )
        price = prices.spot(ec2, "us-east-1a", "c7i.large")
    assert price == Price(
        None,
        "unknown: EC2 DescribeSpotPriceHistory: UnauthorizedOperation: "
        "You are not authorized to perform this operation.",
    )


def test_pricing_endpoint_region():
    assert prices.pricing_region("eu-west-1") == "us-east-1"
    assert prices.pricing_region("ap-northeast-1") == "ap-south-1"
    assert {prices.pricing_region(r) for r in ("us-west-2", "me-south-1", "sa-east-1")} <= set(prices.PRICING_REGIONS)


def _instance(name, instance_type, state="running", lifecycle=None, zone="us-east-1a"):
    instance = {
        "InstanceId": f"i-{name}",
        "InstanceType": instance_type,
        "State": {"Name": state},
        "Placement": {"AvailabilityZone": zone},
        "Tags": [{"Key": "clusterbake:name", "Value": name}],
    }
    if lifecycle:
        instance["InstanceLifecycle"] = lifecycle
    return instance


def test_estimate_prices_each_running_instance_at_its_market():
    asked = []

    def on_demand(instance_type):
        asked.append(("on-demand", instance_type))
        return Price(55.0, "list") if instance_type == "p5.48xlarge" else Price(None, "unknown: no data")

    def spot(instance_type, zone):
        asked.append(("spot", instance_type, zone))
        return Price(0.05, "spot history")

    estimate = billing.estimate(
        [
            _instance("gpu-1", "p5.48xlarge"),
            _instance("gpu-2", "p5.48xlarge", state="stopped"),
            _instance("cpu-1", "c7i.large", lifecycle="spot", zone="us-east-1c"),
            _instance("head", "m7i.2xlarge", state="pending"),
            _instance("big-1", "p5.48xlarge", lifecycle="capacity-block"),
            _instance("gone", "p5.48xlarge", state="shutting-down"),
        ],
        on_demand,
        spot,
    )
    assert [(m.node, m.market, m.usd_per_hour) for m in estimate.machines] == [
        ("big-1", "capacity-block", None),
        ("cpu-1", "spot", 0.05),
        ("gpu-1", "on-demand", 55.0),
        ("head", "on-demand", None),
    ]
    assert ("spot", "c7i.large", "us-east-1c") in asked and ("on-demand", "m7i.2xlarge") in asked
    assert estimate.usd_per_hour == pytest.approx(55.05) and not estimate.complete
    assert estimate.machines[0].source.startswith("unknown: a Capacity Block is paid when it is reserved")
    assert estimate.note == "1 stopped instance(s): no instance hours, their EBS volumes still bill"
    assert estimate.not_included == ["EBS volumes", "EFS/FSx storage", "data transfer"]
    data = estimate.to_json()
    assert data["per_hour"] == pytest.approx(55.05) and data["currency"] == "USD" and data["complete"] is False
    assert data["machines"][2] == {
        "node": "gpu-1",
        "instance_id": "i-gpu-1",
        "instance_type": "p5.48xlarge",
        "market": "on-demand",
        "per_hour": 55.0,
        "source": "list",
    }


def test_estimate_of_nothing_priced_is_unknown_and_of_nothing_running_zero():
    unknown = billing.estimate([_instance("head", "m7i.2xlarge")], lambda t: Price(None, "unknown: x"), None)
    assert unknown.usd_per_hour is None and unknown.to_json()["per_hour"] is None
    assert billing.estimate([_instance("head", "m7i.2xlarge", state="stopped")], None, None).usd_per_hour == 0.0


# --- billing.leftovers: what moto cannot show ---------------------------------------


def _client(service: str):
    return botocore.session.get_session().create_client(
        service, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def _fsx(fs_id: str, lifecycle: str, **tag_values: str) -> dict:
    tags = {"clusterbake:cluster": "lefty", **tag_values}
    return {
        "FileSystemId": fs_id,
        "FileSystemType": "LUSTRE",
        "Lifecycle": lifecycle,
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }


def test_leftovers_reads_fsx_lifecycle_and_says_what_it_could_not_check():
    """FSx file systems with a Lifecycle (moto's have none), and a check that is denied."""
    ec2, efs, fsx, sm = ec2_client(), _client("efs"), _client("fsx"), _client("secretsmanager")
    tag = {"Name": "tag:clusterbake:cluster", "Values": ["lefty"]}
    with Stubber(ec2) as e, Stubber(efs) as s_efs, Stubber(fsx) as s_fsx, Stubber(sm) as s_sm:
        e.add_response(
            "describe_instances",
            {"Reservations": []},
            {
                "Filters": [tag, {"Name": "instance-state-name", "Values": list(billing.discover.NOT_GONE)}],
                "MaxResults": 1000,
            },
        )
        e.add_client_error(
            "describe_volumes",
            "UnauthorizedOperation",
            "You are not authorized to perform this operation.",
            expected_params={"Filters": [tag], "MaxResults": 500},
        )
        s_efs.add_response("describe_file_systems", {"FileSystems": []}, {})
        s_fsx.add_response(
            "describe_file_systems",
            {
                "FileSystems": [
                    _fsx(
                        "fs-0aaaaaaaaaaaaaaa1",
                        "AVAILABLE",
                        **{"clusterbake:storage": "scratch", "clusterbake:retain": "false"},
                    ),
                    _fsx(
                        "fs-0bbbbbbbbbbbbbbb2",
                        "AVAILABLE",
                        **{"clusterbake:storage": "keep", "clusterbake:retain": "true"},
                    ),
                    _fsx(
                        "fs-0ccccccccccccccc3",
                        "DELETING",
                        **{"clusterbake:storage": "old", "clusterbake:retain": "false"},
                    ),
                    {
                        **_fsx("fs-0ddddddddddddddd4", "AVAILABLE"),
                        "Tags": [{"Key": "clusterbake:cluster", "Value": "other"}],
                    },
                ]
            },
            {},
        )
        s_sm.add_response("list_secrets", {"SecretList": []}, {"IncludePlannedDeletion": True, "Filters": ANY})
        check = billing.leftovers(ec2, efs, fsx, sm, "lefty", [])
    assert [(item.what, item.kept) for item in check.leftovers] == [
        ("fsx_lustre fs-0aaaaaaaaaaaaaaa1 (AVAILABLE)", False),
        ("fsx_lustre fs-0bbbbbbbbbbbbbbb2 (storage keep: retain)", True),
    ]
    assert check.unchecked == [
        "EBS volumes (DescribeVolumes: UnauthorizedOperation: You are not authorized to perform this operation.)"
    ]
    assert [item.what for item in check.unexpected] == ["fsx_lustre fs-0aaaaaaaaaaaaaaa1 (AVAILABLE)"]


def test_an_unreachable_price_list_endpoint_is_tried_once_per_process(monkeypatch):
    """A controller that reaches EC2 but not the Price List API: one short failed try, then unknown."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }.items():
        monkeypatch.setenv(key, value)
    pricing = prices.pricing_client("eu-west-1")
    assert pricing.meta.region_name == "us-east-1"
    assert pricing.meta.config.connect_timeout == prices.CONNECT_TIMEOUT
    sent = []
    pricing.meta.events.register("before-send.pricing.GetProducts", lambda **_: sent.append(1))
    first = prices.on_demand(pricing, "eu-west-1", "p5.48xlarge")
    second = prices.on_demand(pricing, "eu-west-1", "c7i.large")
    assert len(sent) == 1
    assert first.source.startswith("unknown: Price List GetProducts: Could not connect to the endpoint URL")
    assert second.source == first.source and second.usd_per_hour is None
