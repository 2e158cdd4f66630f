"""Azure Policy denials said plainly: which assignment refused which of the cluster's resources, the
property it refused, why the cluster sets it so, and what to do.

ARM refuses a write that a deny assignment covers with 403 RequestDisallowedByPolicy, the
resource's name as `target` and, in `additionalInfo`, a PolicyViolation naming the policy
definition and assignment and the expressions it evaluated (Microsoft's "Resolve errors for
request disallowed by policy"). Common ones meet what clusterbake makes on purpose: "Secure
transfer to storage accounts should be enabled" (NFS Azure Files carries no TLS) and "Azure Key
Vault should use RBAC permission model" (the cluster's vault grants by access policy).
"""

from __future__ import annotations

import json
import re

DENIED = "RequestDisallowedByPolicy"
# Why the cluster makes a resource of each type as it does, and what else there is to do than an exemption
# (lower-case type -> (reason, alternative)).
WHY = {
    "microsoft.storage/storageaccounts": (
        "NFS Azure Files shares (storage type azure_files) carry no TLS, so their premium FileStorage account "
        "must allow plain NFS (secure transfer off), reached from the cluster's subnet only; blob containers' "
        "accounts take HTTPS only",
        "or use another storage type than azure_files (azure_blob, amlfs, nfs)",
    ),
    "microsoft.keyvault/vaults": (
        "the cluster's key vault grants the nodes' identity read of their join bundles by access policy "
        "(enableRbacAuthorization false) on its public endpoint, which the nodes reach at boot",
        "(clusterbake has no RBAC-mode vault yet)",
    ),
}
OTHERWISE = "or change the config so the cluster does not need it"
NOUNS = {"microsoft.storage/storageaccounts": "storage account", "microsoft.keyvault/vaults": "key vault"}
RESOURCE = re.compile(r"/resourceGroups/([^/]+)/providers/([^/]+/[^/]+)/([^/?]+)", re.IGNORECASE)


def explain(exc: BaseException) -> str | None:
    """The denial in words, or None when `exc` is not an Azure Policy denial."""
    error = getattr(exc, "error", None)
    if getattr(error, "code", None) != DENIED:
        return None
    violations = [i.info for i in getattr(error, "additional_info", None) or [] if i.type == "PolicyViolation"]
    request = getattr(getattr(exc, "response", None), "request", None)
    found = RESOURCE.search(getattr(request, "url", "") or "")
    group, kind, name = found.groups() if found else (None, "", error.target or "?")
    noun = NOUNS.get(kind.lower()) or kind.rsplit("/", 1)[-1] or "resource"
    what = f"{noun} {name}" + (f" (resource group {group})" if group else "")
    refusals = [_refusal(v) for v in violations] or [_from_message(error.message or "")]
    text = f"Azure Policy denied {what}: " + "; ".join(refusals) + "."
    why, otherwise = WHY.get(kind.lower(), (None, OTHERWISE))
    if why:
        text += f" The cluster needs it so: {why}."
    where = f"resource group {group}" if group else "the cluster's resource groups"
    return (
        text + f" Ask your Azure Policy administrator for an exemption of {where} from that assignment "
        f"(az policy exemption create), {otherwise}"
    )


def _refusal(info: dict) -> str:
    """One violation: the assignment (its scope), the definition, and the property it refused."""
    assignment = info.get("policyAssignmentDisplayName") or info.get("policyAssignmentName") or "?"
    definition = info.get("policyDefinitionDisplayName") or info.get("policyDefinitionName") or "?"
    text = f"assignment '{assignment}' at {info.get('policyAssignmentScope') or '?'} (policy '{definition}')"
    expressions = (info.get("evaluationDetails") or {}).get("evaluatedExpressions") or []
    fields = [e for e in expressions if e.get("expressionKind") == "Field" and e.get("path") not in (None, "type")]
    if fields:
        text += " refuses " + ", ".join(f"{e['path']} = {json.dumps(e.get('expressionValue'))}" for e in fields)
    return text


def _from_message(message: str) -> str:
    """Without additionalInfo: the assignments named in the message's policy identifiers."""
    found = re.search(r"Policy identifiers: '(\[.*\])'", message)
    try:
        identifiers = json.loads(found.group(1)) if found else []
    except ValueError:
        identifiers = []
    names = [f"assignment '{i['policyAssignment']['name']}'" for i in identifiers if "policyAssignment" in i]
    return ", ".join(names) or message
