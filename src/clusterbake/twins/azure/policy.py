"""Azure Policy's deny effect, as ARM applies it to a resource's PUT or PATCH (Microsoft's "Resolve errors
for request disallowed by policy"; the answer's shape as Azure gives it for "Secure transfer to
storage accounts should be enabled").

A test sets the subscription's deny assignments with `PUT /_twin/policies`, a list of

    {"name": "deny-http-storage",                       # the assignment's name
     "displayName": "Secure transfer to storage accounts should be enabled",
     "definition": "404c3081-a854-4457-ae30-26a93ef643f9",   # a built-in definition's name (GUID)
     "scope": "/subscriptions/<s>/resourceGroups/<g>",   # default: the subscription
     "resourceType": "Microsoft.Storage/storageAccounts",
     "field": "properties.supportsHttpsTrafficOnly",     # a path in the resource's body
     "equals": false}                                    # or "notEquals": true; a missing field is null

A request that writes a resource of that type under the scope whose body (a PATCH: the resource
after it) meets the condition is refused before anything changes: 403 RequestDisallowedByPolicy,
`target` the resource's name, the message naming the assignment and the definition, and
`additionalInfo` [{"type": "PolicyViolation", "info": {policyDefinitionDisplayName,
policyDefinitionId, policyDefinitionName, policyDefinitionEffect, policyAssignmentName,
policyAssignmentDisplayName, policyAssignmentId, policyAssignmentScope, policyAssignmentParameters,
evaluationDetails}}]. Azure's policy language (aliases, anyOf/allOf, other effects) is not emulated:
one field of the body against one value, the definition's display name the assignment's.
"""

from __future__ import annotations

import json

from clusterbake.twins.azure.resource import ArmError, ResourceId

REQUIRED = ("name", "displayName", "definition", "resourceType", "field")


def validated(assignments, subscription: str) -> list[dict]:
    """The switch's body, checked: each assignment with its scope (default the subscription)."""
    if not isinstance(assignments, list):
        raise ArmError(400, "InvalidRequestContent", "PUT /_twin/policies takes a list of deny assignments.")
    out = []
    for assignment in assignments:
        missing = [k for k in REQUIRED if not assignment.get(k)]
        if missing or ("equals" in assignment) == ("notEquals" in assignment):
            raise ArmError(400, "InvalidPolicyRule", f"a deny assignment needs {', '.join(REQUIRED)} and one of "
                           f"equals / notEquals: {assignment}")  # fmt: skip
        out.append({"scope": f"/subscriptions/{subscription}", **assignment})
    return out


def check(assignments: list[dict], rid: ResourceId, body: dict) -> None:
    """Refuse the write of `body` at `rid` as ARM does when a deny assignment's condition holds."""
    for assignment in assignments:
        scope = assignment["scope"].rstrip("/").lower()
        if rid.type_name.lower() != assignment["resourceType"].lower():
            continue
        if str(rid).lower() != scope and not str(rid).lower().startswith(scope + "/"):
            continue
        value = _at(body, assignment["field"])
        operator = "Equals" if "equals" in assignment else "NotEquals"
        target = assignment.get("equals", assignment.get("notEquals"))
        if (value == target) == (operator == "Equals"):
            raise _denied(assignment, rid, value, operator, target)


def _at(body: dict, path: str):
    value = body
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _denied(assignment: dict, rid: ResourceId, value, operator: str, target) -> ArmError:
    assignment_id = f"{assignment['scope']}/providers/Microsoft.Authorization/policyAssignments/{assignment['name']}"
    definition_id = f"/providers/Microsoft.Authorization/policyDefinitions/{assignment['definition']}"
    identifiers = [
        {
            "policyAssignment": {"name": assignment["displayName"], "id": assignment_id},
            "policyDefinition": {"name": assignment["displayName"], "id": definition_id},
        }
    ]
    field = assignment["field"]
    expressions = [
        {"result": "True", "expressionKind": "Field", "expression": "type", "path": "type",
         "expressionValue": rid.type_name, "targetValue": assignment["resourceType"], "operator": "Equals"},
        {"result": "True", "expressionKind": "Field", "path": field,
         "expression": f"{assignment['resourceType']}/{field.rsplit('.', 1)[-1]}",
         "expressionValue": value, "targetValue": target, "operator": operator},
    ]  # fmt: skip
    info = {
        "evaluationDetails": {"evaluatedExpressions": expressions},
        "policyDefinitionId": definition_id,
        "policyDefinitionName": assignment["definition"],
        "policyDefinitionDisplayName": assignment["displayName"],
        "policyDefinitionEffect": "Deny",
        "policyAssignmentId": assignment_id,
        "policyAssignmentName": assignment["name"],
        "policyAssignmentDisplayName": assignment["displayName"],
        "policyAssignmentScope": assignment["scope"],
        "policyAssignmentParameters": {},
    }
    error = ArmError(
        403,
        "RequestDisallowedByPolicy",
        f"Resource '{rid.name}' was disallowed by policy. Policy identifiers: '{json.dumps(identifiers)}'.",
        rid.name,
    )
    error.extra = {"additionalInfo": [{"type": "PolicyViolation", "info": info}]}
    return error
