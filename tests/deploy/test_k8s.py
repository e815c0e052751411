"""deploy/k8s through the real `kubectl kustomize`, validated offline against the Kubernetes
schemas (kubernetes-validate, strict: an unknown field is an error), then read for what
docs/deploy.md promises: the scheduler's replicas, probes, HPA, PDB and Service; Redis with AOF
on a claim (or an external one); GPU workers and trainer with the model from a volume; tokens
only from the Secret; SARA_* names the programs really read; the /metrics scrape.

Skips only when kubectl is absent (CI's image has it); kubernetes-validate is in the dev extra.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from tests._need import need

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBE_VERSION = "1.32.0"
RENDERS = ("", "base", "overlays/external-redis", "overlays/monitoring")
CRDS = {"ServiceMonitor"}  # not in the Kubernetes schemas: checked by hand below
TOKEN_KEYS = {"worker", "trainer", "operator", "admin"}
SECRET_NAME = r"(TOKEN|SECRET|PASSWORD)$"  # SARA_WORKER_TOKEN, not SARA_MAX_TOKENS


def render(sub: str) -> list[dict]:
    """Every object `kubectl kustomize deploy/k8s/<sub>` prints."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: it renders deploy/k8s (kubectl kustomize)")
    out = subprocess.run([kubectl, "kustomize", str(K8S / sub)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def stack() -> list[dict]:
    return render("")


def one(objs: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def containers(objs: list[dict]):
    """(object, pod spec, container) for every container of every workload."""
    for o in objs:
        spec = o.get("spec", {})
        pod = spec.get("template", {}).get("spec")
        if pod:
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                yield o, pod, c


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("sub", RENDERS)
def test_every_render_validates_strictly_against_the_kubernetes_schemas(sub):
    kv = need("kubernetes_validate", "kubernetes-validate is not installed (the dev extra)")
    objs = render(sub)
    assert len(objs) >= 8
    for obj in objs:
        if obj["kind"] not in CRDS:
            kv.validate(obj, KUBE_VERSION, strict=True)
        assert obj["metadata"].get("namespace") == "sara", obj["metadata"]["name"]


def test_strict_validation_rejects_a_misspelt_field(stack):
    kv = need("kubernetes_validate", "kubernetes-validate is not installed (the dev extra)")
    bad = copy.deepcopy(one(stack, "Deployment", "sara-scheduler"))
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kv.ValidationError, match="readinesProbe"):
        kv.validate(bad, KUBE_VERSION, strict=True)


def test_the_scheduler_runs_replicated_behind_probes_a_service_an_hpa_and_a_pdb(stack):
    deploy = one(stack, "Deployment", "sara-scheduler")
    pod = deploy["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (c,) = pod["spec"]["containers"]
    assert deploy["spec"]["replicas"] >= 2
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {c["readinessProbe"]["httpGet"]["port"], c["livenessProbe"]["httpGet"]["port"]} <= \
        set(port) | set(port.values())
    assert c["args"][:1] == ["serve"] and c["args"][c["args"].index("--port") + 1] == "8000"
    svc = one(stack, "Service", "sara-scheduler")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"] and "http" in port
    hpa = one(stack, "HorizontalPodAutoscaler", "sara-scheduler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "sara-scheduler"}
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert "cpu" in c["resources"]["requests"]  # the HPA's utilisation is of this request
    pdb = one(stack, "PodDisruptionBudget", "sara-scheduler")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < deploy["spec"]["replicas"]  # a drain can proceed


def test_redis_keeps_an_aof_on_a_claim_and_the_scheduler_points_at_it(stack):
    sts = one(stack, "StatefulSet", "sara-redis")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert args[args.index("--dir") + 1] == mount["mountPath"]
    svc = one(stack, "Service", "sara-redis")
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    url = one(stack, "ConfigMap", "sara-config")["data"]["SARA_REDIS_URL"]
    assert url == f"redis://sara-redis:{svc['spec']['ports'][0]['port']}/0"
    policy = one(stack, "NetworkPolicy", "sara-redis")
    (rule,) = policy["spec"]["ingress"]
    scheduler_labels = one(stack, "Deployment", "sara-scheduler")["spec"]["template"]["metadata"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= \
        scheduler_labels["labels"].items()


def test_the_external_redis_overlay_drops_redis_and_points_outside():
    objs = render("overlays/external-redis")
    assert not [o for o in objs if o["metadata"]["name"] == "sara-redis"]
    url = one(objs, "ConfigMap", "sara-config")["data"]["SARA_REDIS_URL"]
    from sara_service.store.redis_client import cluster_node_url

    assert cluster_node_url(url)  # a cluster URL the service understands
    assert one(objs, "Deployment", "sara-worker")  # the rest of the stack is there


def _volume_of(pod: dict, container: dict, path: str) -> dict:
    """The pod volume mounted at `path` (or the one whose mount `path` lies under)."""
    (mount,) = [m for m in container["volumeMounts"]
                if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume


@pytest.mark.parametrize("kind,name", [("Deployment", "sara-worker"), ("Job", "sara-trainer")])
def test_workers_and_trainer_take_a_gpu_and_the_model_from_a_volume(stack, kind, name):
    obj = one(stack, kind, name)
    pod = obj["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    model = one(stack, "ConfigMap", "sara-gpu-config")["data"]["SARA_MODEL"]
    assert "$(SARA_MODEL)" in c["args"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert _volume_of(pod, c, model)["persistentVolumeClaim"]["claimName"] == "sara-models"
    assert _volume_of(pod, c, "/checkpoints")["persistentVolumeClaim"]["claimName"] == \
        "sara-checkpoints"
    for claim in claims:
        assert one(stack, "PersistentVolumeClaim", claim)
    assert one(stack, "PersistentVolumeClaim", "sara-checkpoints")["spec"]["accessModes"] == \
        ["ReadWriteMany"]  # the trainer writes, workers on other nodes read


def test_a_trainer_restart_resumes_and_the_worker_drains_within_its_grace(stack):
    job = one(stack, "Job", "sara-trainer")["spec"]
    assert job["parallelism"] == 1 and job["template"]["spec"]["restartPolicy"] == "OnFailure"
    pod = one(stack, "Deployment", "sara-worker")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--on-stop") + 1] == "finish"
    assert pod["terminationGracePeriodSeconds"] > float(args[args.index("--drain-timeout") + 1])


def test_tokens_come_only_from_the_secret(stack):
    assert not [o for o in stack if o["kind"] == "Secret"]  # created by hand (docs/deploy.md)
    seen = set()
    for obj, _, c in containers(stack):
        for name, e in env_of(c).items():
            if re.search(SECRET_NAME, name):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                assert ref and "value" not in e, f"{obj['metadata']['name']}: {name}"
                assert ref["name"] == "sara-tokens" and ref["key"] in TOKEN_KEYS
                seen.add(ref["key"])
        assert "--token" not in c.get("args", [])  # would put the token in the pod spec
    assert seen == TOKEN_KEYS
    for cm in (o for o in stack if o["kind"] == "ConfigMap"):
        assert not [k for k in cm["data"] if re.search(SECRET_NAME, k)]
    text = "\n".join(p.read_text() for p in K8S.rglob("*.yaml"))
    assert not [w for w in re.findall(r"[A-Za-z0-9_\-]{24,}", text) if looks_random(w)]


def looks_random(word: str) -> bool:
    """Shaped like a generated token (token_urlsafe: long, upper, lower and digits mixed)."""
    return all(re.search(p, word) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))


def test_a_literal_token_would_be_seen():
    assert looks_random("Xq3vN0cUu6k1yqJ2mWf7-ZpR9sLb4tEh")
    assert not looks_random("SARA_VLLM_GPU_MEMORY_UTILIZATION")


def test_the_docs_create_the_secret_with_every_key_the_manifests_read():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    (command,) = re.findall(r"create secret generic sara-tokens(.*?)\n(?!\s)", doc, re.S)
    assert set(re.findall(r"--from-literal=(\w+)=", command)) == TOKEN_KEYS


def test_every_sara_variable_is_one_the_programs_read(stack):
    import typer.main

    from sara_cli.main import app
    from sara_service.settings import Settings

    known = {f"SARA_{name.upper()}" for name in Settings.model_fields}
    for param in _cli_params(typer.main.get_command(app)):
        envvar = param.envvar or []
        known |= {envvar} if isinstance(envvar, str) else set(envvar)
    gpu_only = set(one(stack, "ConfigMap", "sara-gpu-config")["data"])  # feed $(VAR) in args
    names = set(one(stack, "ConfigMap", "sara-config")["data"])
    for _, _, c in containers(stack):
        names |= set(env_of(c))
    unknown = {n for n in names if n.startswith("SARA_")} - known - gpu_only
    assert not unknown, f"no program reads {sorted(unknown)}"


def _cli_params(command):
    yield from command.params
    for sub in getattr(command, "commands", {}).values():
        yield from _cli_params(sub)


@pytest.mark.parametrize("kind,name", [("Deployment", "sara-scheduler"),
                                       ("Deployment", "sara-worker"), ("Job", "sara-trainer")])
def test_each_container_runs_a_sara_command_its_cli_accepts(stack, kind, name):
    """The args, $(VAR)s filled from the ConfigMaps, parse with the real `sara` CLI."""
    import typer.main

    from sara_cli.main import app

    (c,) = one(stack, kind, name)["spec"]["template"]["spec"]["containers"]
    values = {**one(stack, "ConfigMap", "sara-config")["data"],
              **one(stack, "ConfigMap", "sara-gpu-config")["data"]}
    args = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in c["args"]]
    cli = typer.main.get_command(app)
    group = click.Context(cli, info_name="sara")
    sub = cli.get_command(group, args[0])
    assert sub is not None, f"sara has no command {args[0]!r}"
    sub.make_context(args[0], args[1:], parent=group)  # raises on an unknown option, a bad value


def test_metrics_are_scraped_with_the_operator_token():
    objs = render("overlays/monitoring")
    pod = one(objs, "Deployment", "sara-scheduler")["spec"]["template"]
    notes = pod["metadata"]["annotations"]
    ports = {p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert int(notes["prometheus.io/port"]) in ports
    monitor = one(objs, "ServiceMonitor", "sara-scheduler")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    svc = one(objs, "Service", "sara-scheduler")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"] == {"name": "sara-tokens", "key": "operator"}
