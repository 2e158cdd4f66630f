"""The hourly price of an EC2 instance type, on-demand and spot, asked of AWS once per process.

A price that cannot be had (no permission, the API not served by the endpoint, no
data) is returned as unknown with the reason: never guessed, and there is no price
table here.

- On-demand: the Price List Query API, `GetProducts` (client `pricing`, whose endpoints
  are in us-east-1 and ap-south-1 only; they answer for every region), ServiceCode
  `AmazonEC2`, TERM_MATCH filters `instanceType`, `regionCode` (the region's code; the
  other way, `location`, wants the region's long name as the price list spells it,
  "EU (Frankfurt)", where botocore's region names say "Europe (Frankfurt)"),
  `operatingSystem=Linux`, `tenancy=Shared`, `preInstalledSw=NA`,
  `licenseModel=No License required`, `capacitystatus=Used`. Each PriceList entry is
  a JSON document (a string): `product.attributes`, `publicationDate`, and
  `terms.OnDemand.<sku.offerTermCode>.priceDimensions.<rateCode>` with `unit` "Hrs"
  and `pricePerUnit.USD` (a decimal string). Should several products match, the
  highest price is taken (a cost guard errs high) and the source says so.
- Spot: EC2 `DescribeSpotPriceHistory` for the type in one Availability Zone,
  ProductDescriptions ["Linux/UNIX"], StartTime = EndTime = now: EC2 then returns the
  last price change before that time, the price in effect now.

Every call goes through api.call / api.paginate (throttling retried).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from clusterbake.providers.aws.api import error_code, paginate
from clusterbake.providers.base import Price

PRICING_REGIONS = ("us-east-1", "ap-south-1")
ON_DEMAND_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "licenseModel": "No License required",
    "capacitystatus": "Used",
}
SPOT_PRODUCT = "Linux/UNIX"
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 20.0


_cache: dict[tuple[str, str, str], Price] = {}
# Endpoints that could not be reached in this process: not tried again for every type.
_unreachable: dict[str, str] = {}


def clear_cache() -> None:
    _cache.clear()
    _unreachable.clear()


def pricing_region(region: str) -> str:
    """The Price List endpoint nearest to `region` (either answers for every region)."""
    return "ap-south-1" if region.startswith(("ap-", "me-", "af-")) else "us-east-1"


def pricing_client(region: str):
    """A Price List Query API client for a cluster in `region`: as api.client (botocore's retries
    off), with short timeouts: a controller that reaches EC2 through a VPC endpoint may not
    reach this API at all, and `cluster status` must not hang on it."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        user_agent_appid="clusterbake",
    )
    return boto3.session.Session().client("pricing", region_name=pricing_region(region), config=config)


def reason(exc: Exception, operation: str = "") -> str:
    """A one-line why of a failed call: `Operation: Code: message`."""
    if isinstance(exc, ClientError):
        message = exc.response.get("Error", {}).get("Message", "").strip()
        if message.startswith("<"):  # an HTML error page: an endpoint that does not serve this API
            message = ""
        code = error_code(exc) or "error"
        text = f"{exc.operation_name}: {'HTTP ' + code if code.isdigit() else code}"
        return f"{text}: {message.splitlines()[0]}" if message else text
    text = str(exc) or type(exc).__name__
    return f"{operation}: {text}" if operation else text


def _unknown(why: str) -> Price:
    return Price(None, f"unknown: {why}")


def on_demand(pricing, region: str, instance_type: str) -> Price:
    """The on-demand Linux price of `instance_type` in `region` (`pricing`: a client of the
    Price List Query API, see pricing_region)."""
    key = ("on-demand", region, instance_type)
    if key not in _cache:
        _cache[key] = _on_demand(pricing, region, instance_type)
    return _cache[key]


def _on_demand(pricing, region: str, instance_type: str) -> Price:
    fields = {"instanceType": instance_type, "regionCode": region, **ON_DEMAND_FILTERS}
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in fields.items()]
    endpoint = pricing.meta.endpoint_url
    if endpoint in _unreachable:
        return _unknown(_unreachable[endpoint])
    try:
        # A controller without a route to the Price List API: one short try (the price is only shown).
        documents = paginate(
            pricing,
            "get_products",
            "PriceList",
            retry_transient=False,
            ServiceCode="AmazonEC2",
            Filters=filters,
            FormatVersion="aws_v1",
        )
    except (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError) as exc:
        _unreachable[endpoint] = f"Price List {reason(exc, 'GetProducts')}"
        return _unknown(_unreachable[endpoint])
    except (ClientError, BotoCoreError) as exc:
        return _unknown(f"Price List {reason(exc, 'GetProducts')}")
    try:
        found = [hourly for document in documents for hourly in _hourly_prices(document)]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return _unknown(f"Price List GetProducts: unexpected answer ({type(exc).__name__}: {exc})")
    if not found:
        return _unknown(f"Price List GetProducts: no on-demand Linux price of {instance_type} in {region}")
    price, published = max(found)
    source = "AWS Price List API" + (f", published {published[:10]}" if published else "")
    if len({p for p, _ in found}) > 1:
        source += f", highest of {len(found)} matching offers"
    return Price(price, source)


def _hourly_prices(document: str | dict) -> list[tuple[float, str]]:
    """(USD per hour, publication date) of each hourly on-demand price dimension of one PriceList entry."""
    data = json.loads(document) if isinstance(document, str) else document
    published = data.get("publicationDate", "")
    found = []
    for term in data.get("terms", {}).get("OnDemand", {}).values():
        terms = [term] if "priceDimensions" in term else list(term.values())  # offer files nest one level more
        for one in terms:
            for dimension in one.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if usd is not None and dimension.get("unit", "").lower() in ("hrs", "hours", "hour"):
                    found.append((float(usd), published))
    return found


def spot(ec2, zone: str, instance_type: str) -> Price:
    """The spot price of `instance_type` (Linux/UNIX) in Availability Zone `zone` now."""
    key = ("spot", zone, instance_type)
    if key not in _cache:
        _cache[key] = _spot(ec2, zone, instance_type)
    return _cache[key]


def _spot(ec2, zone: str, instance_type: str) -> Price:
    now = datetime.now(UTC)
    try:
        history = paginate(
            ec2,
            "describe_spot_price_history",
            "SpotPriceHistory",
            InstanceTypes=[instance_type],
            ProductDescriptions=[SPOT_PRODUCT],
            AvailabilityZone=zone,
            StartTime=now,
            EndTime=now,
        )
    except (ClientError, BotoCoreError) as exc:
        return _unknown(f"EC2 {reason(exc, 'DescribeSpotPriceHistory')}")
    # Filtered again here: the zone and type are what the answer must be about.
    history = [h for h in history if h.get("AvailabilityZone") == zone and h.get("InstanceType") == instance_type]
    if not history:
        return _unknown(f"EC2 DescribeSpotPriceHistory: no spot price of {instance_type} in {zone}")
    latest = max(history, key=lambda h: h["Timestamp"])
    try:
        price = float(latest["SpotPrice"])
    except (KeyError, ValueError) as exc:
        return _unknown(f"EC2 DescribeSpotPriceHistory: unexpected answer ({exc})")
    stamp = latest["Timestamp"]
    when = stamp.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if isinstance(stamp, datetime) else str(stamp)
    return Price(price, f"EC2 spot price history, {zone}, since {when}")
