"""The deployment files: the Kubernetes manifests (deploy/kubernetes) validated against the
Kubernetes API's own schemas (kubernetes-validate, strict: an unknown or misspelt field fails),
and the rules between them, the compose file and the Dockerfile that no schema knows: a grace
period longer than the drain, probes and scrapes on the port the processes serve, a disruption
budget that selects the coordinators, an image built only from what its context holds."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hashq.settings import WorkerSettings
from tests.e2e.test_install import PACKAGED
from tools import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())  # the oldest we claim, the newest
MARGIN = 10  # seconds of grace beyond the drain: SIGTERM's delivery, the release, the exit


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources() -> dict[str, dict[str, Any]]:
    """Every resource of the kustomization, by kind/name."""
    found = {}
    for name in kustomization()["resources"]:
        for doc in documents(MANIFESTS / name):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def kustomization() -> dict[str, Any]:
    (doc,) = documents(MANIFESTS / "kustomization.yaml")
    return doc


def settings_data() -> dict[str, str]:
    data: dict[str, str] = resources()["ConfigMap/hashq-settings"]["data"]
    return data


def container(kind_name: str) -> dict[str, Any]:
    (only,) = resources()[kind_name]["spec"]["template"]["spec"]["containers"]
    return dict(only)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_kubernetes(version: str) -> None:
    for name, resource in resources().items():
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} against {version}: {exc.message} at {list(exc.path)}")


def test_the_validator_refuses_a_misspelt_field() -> None:
    """So that the test above means something."""
    worker = copy.deepcopy(resources()["Deployment/hashq-worker"])
    spec = worker["spec"]["template"]["spec"]["containers"][0]
    spec["readinesProbe"] = spec.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, VERSIONS[-1], strict=True)


def test_the_kustomization_lists_every_manifest() -> None:
    files = {path.name for path in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization()["resources"]) == files


def test_a_worker_s_grace_period_outlasts_its_drain() -> None:
    drain = float(settings_data()["HASHQ_DRAIN_TIMEOUT"])
    pod = resources()["Deployment/hashq-worker"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= drain + MARGIN
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if name.startswith("worker"):
            default = WorkerSettings.model_fields["drain_timeout"].default
            drain = float(service["environment"].get("HASHQ_DRAIN_TIMEOUT", default))
            assert float(service["stop_grace_period"].removesuffix("s")) >= drain + MARGIN


def test_probes_and_scrapes_ask_the_port_the_processes_serve() -> None:
    port = int(settings_data()["HASHQ_METRICS_PORT"])
    image = re.search(r"HASHQ_METRICS_PORT=(\d+)", (ROOT / "Dockerfile").read_text())
    assert image and int(image.group(1)) == port
    for kind_name in ("Deployment/hashq-worker", "Deployment/hashq-coordinator"):
        template = resources()[kind_name]["spec"]["template"]
        assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        served = container(kind_name)
        (named,) = served["ports"]
        assert named["containerPort"] == port
        assert served["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": named["name"]}
        assert served["livenessProbe"]["httpGet"] == {"path": "/livez", "port": named["name"]}


def test_every_process_takes_the_settings_and_the_mounted_secrets() -> None:
    secrets_dir = settings_data()["HASHQ_SECRETS_DIR"]
    names = ("Deployment/hashq-worker", "Deployment/hashq-coordinator", "Job/hashq-init")
    for kind_name in names:
        served = container(kind_name)
        assert served["envFrom"] == [{"configMapRef": {"name": "hashq-settings"}}]
        mounts = {mount["name"]: mount for mount in served["volumeMounts"]}
        assert mounts["secrets"]["mountPath"] == secrets_dir
        volumes = resources()[kind_name]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "secrets", "secret": {"secretName": "hashq-secrets"}} in volumes


def test_two_coordinators_and_a_budget_that_keeps_one() -> None:
    coordinators = resources()["Deployment/hashq-coordinator"]
    assert coordinators["spec"]["replicas"] >= 2
    budget = resources()["PodDisruptionBudget/hashq-coordinator"]["spec"]
    assert budget["minAvailable"] == 1
    labels = coordinators["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()


def test_the_image_is_built_only_from_what_its_context_holds() -> None:
    """The Dockerfile copies nothing that .dockerignore leaves out, and its wheel stage copies
    what the package is made of (tests/e2e/test_install.py builds the same wheel)."""
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (?!--from)(?:--chown=\S+ )?(.+) \S+$", dockerfile, re.MULTILINE)
    sources = {source for line in copied for source in line.split()}
    assert sources <= allowed
    wheel_stage = dockerfile.split(" AS runtime")[0]
    wheel_copied = re.findall(r"^COPY (.+) \S+$", wheel_stage, re.MULTILINE)
    assert {source for line in wheel_copied for source in line.split()} == set(PACKAGED)
