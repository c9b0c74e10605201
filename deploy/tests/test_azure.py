"""deploy/azure/prometheus-rule-group.json: prometheus-rules.yaml's alerts as
an Azure Monitor Prometheus rule group (scripts/aks-rule-group.py), checked
against the definitions of the API it is created through."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from support import DEPLOY, REPO, module

SCRIPT = os.path.join(REPO, "scripts", "aks-rule-group.py")
TEMPLATE = os.path.join(DEPLOY, "azure", "prometheus-rule-group.json")
# Azure/azure-rest-api-specs, specification/alertsmanagement/resource-manager/
# Microsoft.AlertsManagement/PrometheusRuleGroups/stable/2023-03-01/
# PrometheusRuleGroups.json: its definitions (deploy/tests/crds/README.md).
DEFINITIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crds",
                           "alertsmanagement_prometheusrulegroups_2023-03-01.json")
ISO8601 = re.compile(r"^PT(\d+H)?(\d+M)?(\d+S)?$")


@pytest.fixture(scope="module")
def generator():
    module("yaml")
    spec = importlib.util.spec_from_file_location("aks_rule_group", SCRIPT)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def test_the_template_is_what_the_script_writes_from_the_rules():
    done = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_rule_group_matches_the_apis_definitions(generator):
    jsonschema = module("jsonschema")
    import check_helm

    yaml = module("yaml")
    with open(DEFINITIONS, encoding="utf-8") as f:
        definitions = check_helm.strict(json.load(f))
    with open(os.path.join(DEPLOY, "prometheus-rules.yaml"), encoding="utf-8") as f:
        plain = yaml.safe_load(f)
    # As Resource Manager sends it, the parameters given.
    group = "/subscriptions/0/resourceGroups/rg/providers/microsoft.monitor/accounts/ws"
    action = "/subscriptions/0/resourceGroups/rg/providers/microsoft.insights/actionGroups/oncall"
    for actions in ([], [{"actionGroupId": action}]):
        props = generator.properties(plain["groups"], "aks-1", group, actions)
        schema = dict(definitions, **{"$ref": "#/definitions/PrometheusRuleGroupProperties"})
        errors = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
                  for e in jsonschema.Draft7Validator(schema).iter_errors(props)]
        assert not errors, errors
        assert props["scopes"] == [group] and ISO8601.match(props["interval"])
        # Every alert of the file, with its expression, labels and
        # annotations; its `for` as ISO 8601, its severity within 0 to 4.
        rules = plain["groups"][0]["rules"]
        assert [r["alert"] for r in props["rules"]] == [r["alert"] for r in rules]
        for azure, prometheus in zip(props["rules"], rules):
            assert azure["expression"] == prometheus["expr"]
            assert azure["labels"] == prometheus["labels"] and azure["annotations"] == prometheus["annotations"]
            if "for" in prometheus:
                assert ISO8601.match(azure["for"]) and azure["for"] == generator.iso8601(prometheus["for"])
            else:
                assert "for" not in azure
            assert 0 <= azure["severity"] <= 4 and azure["actions"] == actions
    with open(TEMPLATE, encoding="utf-8") as f:
        (resource,) = json.load(f)["resources"]
    assert (resource["type"], resource["apiVersion"]) == ("Microsoft.AlertsManagement/prometheusRuleGroups",
                                                          "2023-03-01")


@pytest.mark.parametrize("duration,iso", [("5m", "PT5M"), ("15m", "PT15M"), ("1h30m", "PT1H30M"), ("90s", "PT90S")])
def test_prometheus_durations_become_iso_8601(generator, duration, iso):
    assert generator.iso8601(duration) == iso


@pytest.mark.parametrize("duration", ["5", "1d", "5m3", "m"])
def test_a_duration_iso_8601_cannot_say_the_same_of_is_refused(generator, duration):
    with pytest.raises(ValueError):
        generator.iso8601(duration)


def test_strings_resource_manager_would_evaluate_are_escaped(generator):
    assert generator.literal("[a]") == "[[a]"
    assert generator.literal("up == 0") == "up == 0"
