#!/usr/bin/env python3
"""Writes deploy/azure/prometheus-rule-group.json: the alerts of
deploy/prometheus-rules.yaml as an Azure Resource Manager template of one
Prometheus rule group (Microsoft.AlertsManagement/prometheusRuleGroups,
API version 2023-03-01), for AKS clusters whose metrics go to an Azure
Monitor workspace (the ama-metrics add-on; deploy/components/scrape-aks).

    scripts/aks-rule-group.py           # write the template
    scripts/aks-rule-group.py --check   # exit 1 when the template is stale

Azure Monitor evaluates the group in the workspace, over the data of the
cluster `clusterName` names; an alert fires with the rule's severity and,
when the template is given an action group, notifies it. What changes on
the way from the Prometheus file:

- `for` becomes an ISO 8601 duration (5m: PT5M);
- the `severity` label also sets the alert's severity (critical: 0,
  warning: 2, info: 3; Azure's 0 to 4), and stays a label;
- the group is evaluated every minute (PT1M, a Prometheus's default);
- alerts resolve on their own once their condition is gone (after 10
  minutes of it gone at most, Azure's default for auto-resolution).
"""
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy", "prometheus-rules.yaml")
TEMPLATE = os.path.join(ROOT, "deploy", "azure", "prometheus-rule-group.json")

API_VERSION = "2023-03-01"
SEVERITIES = {"critical": 0, "warning": 2, "info": 3}
UNITS = {"s": "S", "m": "M", "h": "H"}


def iso8601(duration):
    """A Prometheus duration of seconds, minutes and hours (1h30m) as ISO
    8601 (PT1H30M)."""
    parts = re.findall(r"(\d+)([smh])", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"{duration!r}: not a duration of s, m and h")
    return "PT" + "".join(n + UNITS[u] for n, u in parts)


def literal(value):
    """A string as an ARM template takes it literally: one that starts
    with [ would be an expression, and [[ escapes it."""
    return "[" + value if value.startswith("[") else value


def rule(prometheus, actions):
    """One alerting rule of the Prometheus file as an Azure rule."""
    severity = prometheus.get("labels", {}).get("severity")
    if severity not in SEVERITIES:
        raise ValueError(f"{prometheus.get('alert')}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
    azure = {
        "alert": prometheus["alert"],
        "enabled": True,
        "expression": literal(prometheus["expr"]),
        "severity": SEVERITIES[severity],
        "labels": {k: literal(v) for k, v in prometheus.get("labels", {}).items()},
        "annotations": {k: literal(v) for k, v in prometheus.get("annotations", {}).items()},
        "resolveConfiguration": {"autoResolved": True, "timeToResolve": "PT10M"},
        "actions": actions,
    }
    if "for" in prometheus:
        azure["for"] = iso8601(prometheus["for"])
    return azure


def properties(groups, cluster, workspace, actions):
    """The rule group's properties for GROUPS (the Prometheus file's; one
    group, which Azure evaluates as one), with CLUSTER, WORKSPACE and
    ACTIONS as the template's parameters give them."""
    if len(groups) != 1:
        raise ValueError(f"{len(groups)} groups: the template carries one")
    (group,) = groups
    if any("alert" not in r for r in group["rules"]):
        raise ValueError("a recording rule: the template carries alerts only")
    return {
        "description": "imagegc's alerts (deploy/prometheus-rules.yaml; docs/runbook.md has one section per alert)",
        "enabled": True,
        "clusterName": cluster,
        "scopes": [workspace],
        "interval": "PT1M",
        "rules": [rule(r, actions) for r in group["rules"]],
    }


def template(groups):
    """The ARM template of the rule group."""
    return {
        "$schema": "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#",
        "contentVersion": "1.0.0.0",
        "metadata": {
            "description": "imagegc's alerts as an Azure Monitor Prometheus rule group. Written by "
                           "scripts/aks-rule-group.py from deploy/prometheus-rules.yaml: change those, not this.",
        },
        "parameters": {
            "azureMonitorWorkspaceResourceId": {
                "type": "string",
                "metadata": {"description": "The Azure Monitor workspace the cluster's metrics go to."},
            },
            "clusterName": {
                "type": "string",
                "metadata": {"description": "The AKS cluster whose data the rules read (its name)."},
            },
            "actionGroupResourceId": {
                "type": "string",
                "defaultValue": "",
                "metadata": {"description": "An action group the alerts notify; empty: none."},
            },
            "ruleGroupName": {"type": "string", "defaultValue": "imagegc"},
            "location": {"type": "string", "defaultValue": "[resourceGroup().location]"},
        },
        "resources": [
            {
                "type": "Microsoft.AlertsManagement/prometheusRuleGroups",
                "apiVersion": API_VERSION,
                "name": "[parameters('ruleGroupName')]",
                "location": "[parameters('location')]",
                "properties": properties(
                    groups,
                    "[parameters('clusterName')]",
                    "[parameters('azureMonitorWorkspaceResourceId')]",
                    "[if(empty(parameters('actionGroupResourceId')), createArray(), "
                    "createArray(createObject('actionGroupId', parameters('actionGroupResourceId'))))]",
                ),
            }
        ],
    }


def render():
    with open(RULES, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    return json.dumps(template(groups), indent=2, ensure_ascii=False) + "\n"


def main(argv):
    text = render()
    if argv[1:] == ["--check"]:
        with open(TEMPLATE, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{TEMPLATE} is not what scripts/aks-rule-group.py writes from {RULES}: run it", file=sys.stderr)
                return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    with open(TEMPLATE, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
