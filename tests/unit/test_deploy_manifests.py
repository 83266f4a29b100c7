"""The Kubernetes manifests under deploy/kubernetes, rendered by `kubectl kustomize` and
validated offline: core kinds against Kubernetes' schema (kubernetes-validate, strict),
custom resources against the schemas in deploy/kubernetes/schemas, pod parts of custom
resources against Kubernetes' schema inside a Pod; then what the deployment must mean."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tritond.frontend.metrics import Families, model_families
from tritond.wire import replies as R
from tritond.wire.options import MetricsConfig

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is installed by scripts/setup.sh --test")
jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.30"
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.yaml",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.yaml",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.yaml",
}


def render(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        reason = "kubectl is not installed: the manifests cannot be rendered here"
        print(f"SKIP reason: {reason}")
        pytest.skip(reason)
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def registry() -> referencing.Registry:
    resources = []
    for f in (KUBE / "schemas").glob("*.yaml"):
        schema = yaml.safe_load(f.read_text())
        resources.append((schema["$id"], referencing.Resource.from_contents(
            schema, default_specification=referencing.jsonschema.DRAFT202012)))
    return referencing.Registry().with_resources(resources)


def validate_core(doc: dict) -> None:
    kv.validate(doc, K8S_VERSION, strict=True)


def pod_with(containers: list[dict], volumes: list[dict] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
            "spec": {"containers": containers, "volumes": volumes or []}}


def validate(doc: dict) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key not in CUSTOM:
        validate_core(doc)
        return
    schema = yaml.safe_load((KUBE / "schemas" / CUSTOM[key]).read_text())
    jsonschema.Draft202012Validator(schema, registry=registry()).validate(doc)
    spec = doc["spec"]
    if doc["kind"] == "ServingRuntime":
        validate_core(pod_with(spec["containers"], spec.get("volumes")))
    elif doc["kind"] == "InferenceService":
        model = spec["predictor"]["model"]
        validate_core(pod_with([{"name": "m", "image": "x", "resources": model.get("resources", {})}]))
    elif doc["kind"] == "ScaledObject":
        behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
        if behavior:
            validate_core({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                           "metadata": {"name": "check"},
                           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                                    "maxReplicas": 2, "behavior": behavior}})


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("path", ["base", "overlays/gpu", "kserve"])
def test_every_manifest_validates(path):
    docs = render(KUBE / path)
    assert docs
    for doc in docs:
        validate(doc)


def test_validation_is_real():
    """A misspelt field fails both kinds of validation."""
    docs = by_kind(render(KUBE / "base"))
    dep = docs["Deployment"]
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        validate(dep)
    so = docs["ScaledObject"]
    so["spec"]["maxReplicas"] = 3
    with pytest.raises(jsonschema.ValidationError):
        validate(so)


def arg(container: dict, flag: str) -> str:
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    for a in container["args"]:
        if a.startswith(flag + "="):
            return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a.split("=", 1)[1])
    raise AssertionError(f"{flag} not in {container['args']}")


def test_deployment_probes_drain_and_shared_memory():
    docs = by_kind(render(KUBE / "base"))
    values = yaml.safe_load((KUBE / "base" / "values.yaml").read_text())["spec"]
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["command"] == ["tritond", "start"] and c["image"] == values["image"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600      # slow model loads
    # The grace period covers the preStop wait and the whole drain.
    exit_timeout = float(arg(c, "--exit-timeout-secs"))
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert exit_timeout == float(values["exitTimeoutSecs"])
    assert pod["terminationGracePeriodSeconds"] > exit_timeout + float(pre_stop[1])
    assert arg(c, "--model-repository") == values["modelRepository"]
    # /dev/shm is a memory-backed emptyDir of the size values.yaml gives.
    [shm] = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    [vol] = [v for v in pod["volumes"] if v["name"] == shm["name"]]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": values["shmSize"]}
    # Non-root, matching the image's user; nothing written outside its volumes.
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"]
    assert {"/tmp", "/var/cache/tritond"} <= {m["mountPath"] for m in c["volumeMounts"]}


def test_service_monitor_pdb_and_autoscaling_fit_together():
    docs = by_kind(render(KUBE / "base"))
    dep, svc = docs["Deployment"], docs["Service"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert {"http", "grpc", "metrics"} <= set(ports)
    container_ports = {p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert container_ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    sm = docs["ServiceMonitor"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    so = docs["ScaledObject"]
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    [trigger] = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    # The metric the rule reads is one tritond exports.
    metric = re.search(r"\b(nv_\w+|tritond_\w+)", trigger["metadata"]["query"]).group(1)
    assert metric == "nv_inference_pending_request_count"
    families = Families()
    model_families(families, R.ModelSnapshot(
        name="m", version=1, tags={}, success=0, failures={}, inference_count=0, execution_count=0, request_ns=0,
        queue_ns=0, compute_input_ns=0, compute_infer_ns=0, compute_output_ns=0, cache=False, cache_hits=0,
        cache_hit_ns=0, cache_misses=0, cache_miss_ns=0, pending=3, instances_ready=1, restarts=0, workers=[]),
        MetricsConfig())
    assert families.by_name[metric].type == "gauge"
    assert 1 <= so["spec"]["minReplicaCount"] < so["spec"]["maxReplicaCount"]


def test_gpu_overlay_and_kserve_runtime():
    gpu = by_kind(render(KUBE / "overlays" / "gpu"))["Deployment"]["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    docs = by_kind(render(KUBE / "kserve"))
    rt = docs["ServingRuntime"]["spec"]
    assert {f["name"] for f in rt["supportedModelFormats"]} == {"triton", "onnx", "pytorch"}
    assert set(rt["protocolVersions"]) == {"v2", "grpc-v2"}
    [c] = rt["containers"]
    assert arg(c, "--model-repository") == "/mnt/models" and arg(c, "--http-port") == "8080"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    isvc = docs["InferenceService"]["spec"]["predictor"]["model"]
    assert isvc["runtime"] == docs["ServingRuntime"]["metadata"]["name"]
    assert isvc["modelFormat"]["name"] in {f["name"] for f in rt["supportedModelFormats"]}
    assert isvc["protocolVersion"] == "v2"
    assert docs["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == \
        docs["InferenceService"]["metadata"]["name"] + "-predictor"


def test_tritond_accepts_the_manifest_arguments():
    """Every flag the manifests pass parses (a misspelt one is a startup usage error)."""
    from tritond.options import server_options, start_parser
    for path in ("base", "kserve"):
        for doc in render(KUBE / path):
            spec = doc["spec"]
            containers = (spec.get("containers") or
                          spec.get("template", {}).get("spec", {}).get("containers") or [])
            for c in containers:
                env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
                args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
                if path == "base":
                    args = [a.replace("s3://models-bucket/triton", "/models") for a in args]
                server_options(start_parser().parse_args(args))
