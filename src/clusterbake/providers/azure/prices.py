"""The hourly pay-as-you-go price of an Azure VM size, from the Azure Retail Prices API, once per process.

`GET https://prices.azure.com/api/retail/prices` (unauthenticated; Microsoft's "Azure Retail Prices
overview"), api-version 2023-01-01-preview, with the OData filter
`serviceName eq 'Virtual Machines' and armRegionName eq '<location>' and armSkuName eq '<size>'
and priceType eq 'Consumption'` (values case-sensitive since that version), pages followed
through `NextPageLink`. Of the items, those of unit `1 Hour` and type `Consumption` that are
Linux (no `Windows` in `productName`) and of the VM's priority: a Spot VM's have a `skuName`
ending in ` Spot`; a regular VM's neither ` Spot` nor ` Low Priority`. Should several match, the
highest is taken (a cost guard errs high) and the source says so. Prices are in USD, the
currency Microsoft prices Azure in.

A price that cannot be had (the API not reachable, an error, no item) is unknown with the
reason: never guessed, and there is no price table here. The HTTP client is azure-core's
(requests' proxy and CA settings: HTTPS_PROXY, REQUESTS_CA_BUNDLE), one try, short timeouts,
so `cluster status` does not hang on a controller that cannot reach the API.
"""

from __future__ import annotations

from clusterbake.providers.base import Price

RETAIL_PRICES = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 20
MAX_PAGES = 20

_cache: dict[tuple[str, str, bool], Price] = {}
_unreachable: list[str] = []  # the reason, once the API could not be reached in this process


def clear_cache() -> None:
    _cache.clear()
    _unreachable.clear()


def retail_filter(location: str, size: str) -> str:
    return (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{location}' and armSkuName eq '{size}' "
        "and priceType eq 'Consumption'"
    )


def _client():
    """azure-core's HTTP pipeline without credentials (the API is anonymous) and without retries."""
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import (
        ContentDecodePolicy,
        HeadersPolicy,
        ProxyPolicy,
        RedirectPolicy,
        RetryPolicy,
        UserAgentPolicy,
    )

    policies = [
        HeadersPolicy(),
        UserAgentPolicy("clusterbake"),
        ProxyPolicy(),
        ContentDecodePolicy(),
        RedirectPolicy(),
        RetryPolicy(retry_total=0),
    ]
    return PipelineClient(base_url=RETAIL_PRICES, policies=policies)


def _pages(client, location: str, size: str) -> list[dict]:
    from azure.core.rest import HttpRequest

    request = HttpRequest(
        "GET", RETAIL_PRICES, params={"api-version": API_VERSION, "$filter": retail_filter(location, size)}
    )
    items: list[dict] = []
    for _ in range(MAX_PAGES):
        response = client.send_request(request, connection_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT)
        response.raise_for_status()
        page = response.json()
        items += page.get("Items") or []
        link = page.get("NextPageLink")
        if not link:
            return items
        request = HttpRequest("GET", link)
    return items


def is_match(item: dict, spot: bool) -> bool:
    """A Linux hourly pay-as-you-go item of the VM's priority."""
    sku = item.get("skuName") or item.get("meterName") or ""
    if item.get("unitOfMeasure") != "1 Hour" or item.get("type") != "Consumption":
        return False
    if "windows" in (item.get("productName") or "").lower():
        return False
    if sku.endswith(" Low Priority"):
        return False
    return sku.endswith(" Spot") == spot


def vm_price(location: str, size: str, spot: bool = False, client=None) -> Price:
    """The Linux price per hour of `size` in `location` (Spot when `spot`)."""
    key = (location, size.lower(), spot)
    if key not in _cache:
        _cache[key] = _vm_price(location, size, spot, client)
    return _cache[key]


def _vm_price(location: str, size: str, spot: bool, client) -> Price:
    from azure.core.exceptions import AzureError, HttpResponseError, ServiceRequestError, ServiceResponseError

    if _unreachable:
        return Price(None, f"unknown: {_unreachable[0]}")
    try:
        items = _pages(client or _client(), location, size)
    except (ServiceRequestError, ServiceResponseError) as exc:
        _unreachable.append(f"Azure Retail Prices API not reachable ({str(exc).splitlines()[0]})")
        return Price(None, f"unknown: {_unreachable[0]}")
    except HttpResponseError as exc:
        return Price(None, f"unknown: Azure Retail Prices API: HTTP {exc.status_code}")
    except (AzureError, ValueError) as exc:
        return Price(None, f"unknown: Azure Retail Prices API: {type(exc).__name__}: {exc}")
    found = []
    for item in items:
        if not is_match(item, spot):
            continue
        try:
            found.append((float(item["retailPrice"]), item.get("effectiveStartDate") or "", item.get("currencyCode")))
        except (KeyError, TypeError, ValueError):
            continue
    found = [f for f in found if f[2] in (None, "USD")]
    kind = "Spot" if spot else "pay-as-you-go"
    if not found:
        return Price(None, f"unknown: Azure Retail Prices API: no Linux {kind} price of {size} in {location}")
    price, effective, _ = max(found)
    source = f"Azure Retail Prices API ({kind})" + (f", effective {effective[:10]}" if effective else "")
    if len({p for p, _, _ in found}) > 1:
        source += f", highest of {len(found)} matching items"
    return Price(price, source)
