"""The cost guard on Azure: `cluster status` prices what Azure bills from the Azure Retail Prices API,
`cluster down` says what still bills, through the real CLI against the ARM twin (conftest.py).

The Retail Prices API is reached at its real URL, `https://prices.azure.com/api/retail/prices`, through
the twin's HTTPS_PROXY (a tunnel, as for Key Vault): nothing in the product names the twin. The twin
serves that API's answer shape with two fixture items (twins/azure/prices.py: Standard_D2s_v5 in
eastus, Linux $0.096 and Windows $0.188 an hour) and no item for any other size, so those are
"unknown" here, which is what is checked for them. The item selection (Windows, Spot and Low Priority
meters, units, several offers, paging) is checked with scripted answers.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest
from azuretest import example_config, needs_sdk, of_type, run_cb, storage_subnet

from clusterbake import cli
from clusterbake import cluster as cluster_module
from clusterbake.providers.azure import prices

pytestmark = needs_sdk
CLUSTER = "azcost"


@pytest.fixture(scope="module")
def azcost(twin, tmp_path_factory):
    """A head and one node of Standard_D2s_v5 (priced), one Standard_D4s_v5 (no price item), a retained share."""
    state_dir = tmp_path_factory.mktemp("state-azcost")
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"] |= {
        "resource_group": f"{CLUSTER}-rg",
        "subnet_id": storage_subnet(twin, "cost-nodes", "10.70.40.0/24"),
    }
    config["head"] = {"instance_type": "Standard_D2s_v5"}
    config["node_groups"] = [
        {"name": "cpu", "count": 1, "instance_type": "Standard_D2s_v5"},
        {"name": "big", "count": 1, "instance_type": "Standard_D4s_v5"},
    ]
    config["partitions"] = []
    config["storage"] = [{"name": "data", "mount_point": "/data", "type": "azure_files", "retain": True}]
    run_cb(twin, state_dir, config, "cluster", "up", "--provision-only")
    return {"state_dir": state_dir, "config": config, "path": state_dir / f"{CLUSTER}.yaml"}


@pytest.fixture
def in_process(twin, azcost, monkeypatch):
    """The CLI in this process (Slurm's answer faked: the head is not a node here), against the twin."""
    for key, value in {**twin.env, "CLUSTERBAKE_STATE_DIR": str(azcost["state_dir"])}.items():
        monkeypatch.setenv(key, value)
    prices.clear_cache()
    yield
    prices.clear_cache()


def _vm(twin, node: str) -> dict:
    return next(v for v in of_type(twin.resources_of(CLUSTER), "Microsoft.Compute/virtualMachines")
                if v["tags"]["clusterbake-name"] == node)  # fmt: skip


def test_status_prices_what_azure_bills(twin, azcost, in_process, monkeypatch, capsys):
    token = twin.token()
    big = _vm(twin, "big-1")
    status, _, _ = twin.request("POST", f"{big['id']}/deallocate?api-version=2024-07-01", token=token)
    assert status == 202
    monkeypatch.setattr(cluster_module, "slurm_node_states", lambda provider: {"cpu-1": "idle", "big-1": "idle~"})
    try:
        assert cli.main(["-c", str(azcost["path"]), "cluster", "status", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["summary"] == {"running": 2, "stopped": 1, "absent": 0, "powered_down": 1}
        cost = report["cost"]
        machines = {m["node"]: m for m in cost["machines"]}
        assert sorted(machines) == ["cpu-1", "head"]  # the deallocated VM bills no compute
        for name in ("cpu-1", "head"):
            assert machines[name]["per_hour"] == 0.096 and machines[name]["market"] == "on-demand"
            assert machines[name]["source"] == "Azure Retail Prices API (pay-as-you-go), effective 2021-11-01"
            assert machines[name]["instance_id"] == f"{CLUSTER}-{name}"
        assert cost["per_hour"] == pytest.approx(0.192) and cost["complete"] is True
        assert cost["not_included"][0] == "managed disks"
        assert cost["note"] == "1 deallocated VM(s): no compute hours, their disks still bill"
    finally:
        status, _, _ = twin.request("POST", f"{big['id']}/start?api-version=2024-07-01", token=token)
        assert status == 202
    prices.clear_cache()
    assert cli.main(["-c", str(azcost["path"]), "cluster", "status"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert "cost per hour of what runs now (estimate): at least $0.192 (1 of 3 running instance(s) not priced)" in text
    assert (
        "  2 x Standard_D2s_v5 on-demand: $0.096/h each (Azure Retail Prices API (pay-as-you-go), effective 2021-11-01)"
        in text
    )
    assert (
        "  1 x Standard_D4s_v5 on-demand: price unknown (Azure Retail Prices API: no Linux pay-as-you-go price of "
        "Standard_D4s_v5 in eastus)"
    ) in text


def test_a_vm_stopped_from_inside_still_bills(twin, azcost, in_process, monkeypatch, capsys):
    big = _vm(twin, "big-1")
    status, _, _ = twin.request("POST", f"{big['id']}/powerOff?api-version=2024-07-01", token=twin.token())
    assert status == 202
    monkeypatch.setattr(cluster_module, "slurm_node_states", lambda provider: {})
    try:
        assert cli.main(["-c", str(azcost["path"]), "cluster", "status", "--json"]) == 0
        cost = json.loads(capsys.readouterr().out)["cost"]
        assert "big-1" in {m["node"] for m in cost["machines"]}
        assert cost["note"] == "1 VM(s) stopped but still allocated: Azure bills them like running ones"
    finally:
        twin.request("POST", f"{big['id']}/start?api-version=2024-07-01", token=twin.token())


def test_down_says_what_still_bills(twin, azcost):
    down = run_cb(twin, azcost["state_dir"], azcost["config"], "cluster", "down")
    [account] = [r for r in twin.resources_of(CLUSTER) if r["type"] == "Microsoft.Storage/storageAccounts"]
    assert down.stdout.splitlines() == [
        f"still billing, kept on purpose: storageAccounts {account['name']} (storage entry: retain)",
        "nothing else left billing",
    ]
    status, _, _ = twin.request("DELETE", f"{account['id']}?api-version=2023-05-01", token=twin.token())
    assert status in (200, 204)
    last = run_cb(twin, azcost["state_dir"], azcost["config"], "cluster", "down")
    assert last.stdout.splitlines() == ["nothing left billing"]


# --- the item selection, with the API's answers scripted ---------------------------------------------


class Pages:
    """A client with send_request(): each answer from `pages` in order; the requests kept."""

    def __init__(self, *pages):
        self.pages, self.requests = list(pages), []

    def send_request(self, request, **kwargs):
        self.requests.append(request.url)
        page = self.pages.pop(0)

        class Response:
            def raise_for_status(self):
                pass

            def json(self):
                return page

        return Response()


def item(price, product="Virtual Machines NDsv5 Series", sku="ND96isr H100 v5", unit="1 Hour"):
    return {
        "retailPrice": price,
        "productName": product,
        "skuName": sku,
        "unitOfMeasure": unit,
        "type": "Consumption",
        "currencyCode": "USD",
        "effectiveStartDate": "2024-06-01T00:00:00Z",
    }


def test_linux_meter_of_the_vms_priority_across_pages():
    windows, spot = item(107.5, product="Virtual Machines NDsv5 Series Windows"), item(20.1, sku="ND96isr H100 v5 Spot")
    low, disk = item(40.0, sku="ND96isr H100 v5 Low Priority"), item(0.5, unit="1 GB/Month")
    client = Pages(
        {"Items": [windows, spot], "NextPageLink": "https://prices.azure.com/api/retail/prices?$skip=100"},
        {"Items": [low, item(98.32), disk], "NextPageLink": None},
    )
    price = prices.vm_price("eastus", "Standard_ND96isr_H100_v5", client=client)
    assert (price.usd_per_hour, price.source) == (
        98.32,
        "Azure Retail Prices API (pay-as-you-go), effective 2024-06-01",
    )
    query = parse_qs(urlsplit(client.requests[0]).query)
    assert query == {
        "api-version": ["2023-01-01-preview"],
        "$filter": [
            "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and armSkuName eq "
            "'Standard_ND96isr_H100_v5' and priceType eq 'Consumption'"
        ],
    }
    assert client.requests[1] == "https://prices.azure.com/api/retail/prices?$skip=100"
    prices.clear_cache()
    spot = prices.vm_price(
        "eastus", "Standard_ND96isr_H100_v5", spot=True, client=Pages({"Items": [item(20.1, sku="x Spot")]})
    )
    assert spot.usd_per_hour == 20.1 and spot.source.startswith("Azure Retail Prices API (Spot)")
    prices.clear_cache()


def test_several_offers_take_the_highest_and_say_so():
    client = Pages({"Items": [item(3.4), item(3.6)]})
    price = prices.vm_price("westeurope", "Standard_HB120rs_v3", client=client)
    assert price.usd_per_hour == 3.6 and price.source.endswith("highest of 2 matching items")
    prices.clear_cache()


def test_an_unreachable_api_is_unknown_and_asked_once(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens: the controller cannot reach it
    prices.clear_cache()
    first = prices.vm_price("eastus", "Standard_D2s_v5")
    assert first.usd_per_hour is None and first.source.startswith("unknown: Azure Retail Prices API not reachable")
    second = prices.vm_price("eastus", "Standard_D4s_v5")
    assert second.source == first.source  # not tried again for every size
    prices.clear_cache()
