"""The Azure twin's stand-in for the Azure Retail Prices API (`https://prices.azure.com/api/retail/prices`).

Served in the CONNECT proxy's tunnels (arm.py), so a client reaches it at its real URL through
the twin's HTTPS_PROXY, as it reaches Key Vault. The answer has the API's shape
(`{"BillingCurrency", "CustomerEntityId", "CustomerEntityType", "Items", "NextPageLink",
"Count"}`, each item with Microsoft's field names) and its OData `$filter` is applied as the
API applies it: a conjunction of `<field> eq '<value>'`, values case-sensitive
(api-version 2023-01-01-preview), `priceType` naming the items' `type`; an unknown field is
400.

ITEMS are the twin's fixtures, not a price list: the two items of Standard_D2s_v5 in eastus
(Linux and Windows pay-as-you-go) with the figures a public test fixture records as the
live API's answer ($0.096 and $0.188 an hour). Every other size answers no item, as the API
does for a SKU it has no price for, so the product shows its price as unknown there.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

BASE = {
    "currencyCode": "USD",
    "tierMinimumUnits": 0.0,
    "armRegionName": "eastus",
    "location": "US East",
    "effectiveStartDate": "2021-11-01T00:00:00Z",
    "serviceName": "Virtual Machines",
    "serviceFamily": "Compute",
    "unitOfMeasure": "1 Hour",
    "type": "Consumption",
    "isPrimaryMeterRegion": True,
    "armSkuName": "Standard_D2s_v5",
    "meterName": "D2s v5",
    "skuName": "D2s v5",
}
ITEMS = [
    {**BASE, "retailPrice": 0.096, "unitPrice": 0.096, "productName": "Virtual Machines Dsv5 Series"},
    {**BASE, "retailPrice": 0.188, "unitPrice": 0.188, "productName": "Virtual Machines Dsv5 Series Windows"},
]
FIELDS = {"priceType": "type"}
CLAUSE = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$")


def answer(path: str) -> tuple[int, dict]:
    """(status, JSON body) of a GET of the API."""
    split = urlsplit(path)
    if split.path.rstrip("/") != "/api/retail/prices":
        return 404, {"Error": {"Code": "NotFound", "Message": f"{split.path} is not the Retail Prices API"}}
    query = {k: v[-1] for k, v in parse_qs(split.query).items()}
    items = list(ITEMS)
    text = query.get("$filter", "")
    for clause in re.split(r"\s+and\s+", text) if text else []:
        match = CLAUSE.match(clause)
        if match is None:
            return 400, {"Error": {"Code": "BadRequest", "Message": f"Invalid OData filter clause: {clause}"}}
        field, value = FIELDS.get(match.group(1), match.group(1)), match.group(2)
        if field not in BASE and field not in ("retailPrice", "unitPrice", "productName"):
            return 400, {"Error": {"Code": "BadRequest", "Message": f"Unknown filter field {match.group(1)}"}}
        items = [i for i in items if str(i.get(field)) == value]
    currency = query.get("currencyCode", "USD").strip("'")
    if currency != "USD":
        items = []  # the twin has USD figures only
    return 200, {
        "BillingCurrency": currency,
        "CustomerEntityId": "Default",
        "CustomerEntityType": "Retail",
        "Items": items,
        "NextPageLink": None,
        "Count": len(items),
    }
