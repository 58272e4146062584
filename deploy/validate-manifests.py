#!/usr/bin/env python3
"""Checks the manifests under deploy/ offline, so that a broken or inconsistent one is caught
before anyone applies it to a cluster.

- every YAML document parses (PyYAML) and is of a kind the project's in-memory API server will
  serve (ServiceAccount, Role, RoleBinding, Deployment, ConfigMap, Lease);
- each RBAC file grants by name only the election placeholder, and the lock objects its lock kind
  uses (the file's name), with `create` as the only unnamed verb on them;
- the example Deployment's sidecar arguments match its own RBAC (election name, namespace, lock
  kind, service account);
- kubectl parses every file without a server (`kubectl label --local`), if kubectl is installed;
- every object is valid against the Kubernetes schema, if `kubernetes-validate` (PyPI) is
  installed.

Usage: deploy/validate-manifests.py    (exit status 0 when every check passed)
"""

import pathlib
import shutil
import subprocess
import sys

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
ALLOWED_KINDS = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "ConfigMap", "Lease"}
LOCK_RESOURCES = {
    "leases": {("coordination.k8s.io", "leases")},
    "endpoints": {("", "endpoints")},
    "configmaps": {("", "configmaps")},
    "endpointsleases": {("", "endpoints"), ("coordination.k8s.io", "leases")},
    "configmapsleases": {("", "configmaps"), ("coordination.k8s.io", "leases")},
}
NAMED_VERBS = {"get", "update", "list", "watch"}
EVENT_RULE = ({"", "events.k8s.io"}, {"events"}, {"create", "patch"})

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL {message}")


def documents(path):
    with open(path) as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]


def check_lock_role(path, role, kind, election, namespace):
    """The Role of a lock kind grants exactly what that kind's lock needs."""
    expected = LOCK_RESOURCES[kind]
    named, created = set(), set()
    for rule in role.get("rules", []):
        groups, resources, verbs = set(rule["apiGroups"]), set(rule["resources"]), set(rule["verbs"])
        names = rule.get("resourceNames")
        if (groups, resources, verbs) == EVENT_RULE and not names:
            continue
        pairs = {(g, r) for g in groups for r in resources}
        if names is not None:
            if names != [election] or verbs != NAMED_VERBS:
                fail(f"{path}: named rule {rule} must be {sorted(NAMED_VERBS)} on [{election}]")
            named |= pairs
        elif verbs == {"create"}:
            created |= pairs
        else:
            fail(f"{path}: rule {rule} grants more than create without resourceNames")
    if named != expected or created != expected:
        fail(f"{path}: lock kind {kind} needs named rules and create on {sorted(expected)}, "
             f"found named {sorted(named)}, create {sorted(created)}")
    if role["metadata"]["namespace"] != namespace:
        fail(f"{path}: Role namespace {role['metadata']['namespace']} is not {namespace}")


def check_binding(path, docs, role_name, namespace, account="tenure-elector"):
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role_name]
    if len(bindings) != 1:
        fail(f"{path}: expected one RoleBinding to Role {role_name}")
        return
    binding = bindings[0]
    subjects = binding.get("subjects", [])
    if subjects != [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]:
        fail(f"{path}: RoleBinding {binding['metadata']['name']} subjects {subjects}")
    if binding["metadata"]["namespace"] != namespace:
        fail(f"{path}: RoleBinding namespace is not {namespace}")


def check_rbac_file(path, docs):
    kind = path.stem
    roles = [d for d in docs if d["kind"] == "Role"]
    if len(roles) != 1:
        fail(f"{path}: expected exactly one Role")
        return
    role = roles[0]
    if kind == "pod-label":
        rules = role["rules"]
        if rules != [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]:
            fail(f"{path}: pod-label Role must grant only get, patch on pods")
    else:
        check_lock_role(path, role, kind, "example-election", "default")
        accounts = [d for d in docs if d["kind"] == "ServiceAccount"]
        if [a["metadata"]["name"] for a in accounts] != ["tenure-elector"]:
            fail(f"{path}: expected the ServiceAccount tenure-elector")
    check_binding(path, docs, role["metadata"]["name"], "default")


def sidecar_args(deployment):
    spec = deployment["spec"]["template"]["spec"]
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    elector = [c for c in containers if c["name"] == "leader-elector"]
    args = {}
    for arg in elector[0]["args"]:
        name, _, value = arg.partition("=")
        args[name] = value
    return spec, args


def check_example(path, docs):
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    spec, args = sidecar_args(deployment)
    election, namespace = args["--election"], args["--election-namespace"]
    kind = args["--lock-type"]
    for doc in docs:
        if doc["metadata"]["namespace"] != namespace:
            fail(f"{path}: {doc['kind']} {doc['metadata']['name']} is not in {namespace}")
    role = next(d for d in docs if d["kind"] == "Role")
    check_lock_role(path, role, kind, election, namespace)
    check_binding(path, docs, role["metadata"]["name"], namespace, spec["serviceAccountName"])
    for given in ("--election", "--http", "--election-namespace", "--ttl"):
        if given not in args:
            fail(f"{path}: the sidecar lacks leader-elector:0.5's {given}")


def kubectl_parses(path):
    if shutil.which("kubectl") is None:
        print(f"skip kubectl (not installed): {path}")
        return
    # `create --dry-run=client` needs a server for discovery; `label --local` parses offline.
    run = subprocess.run(
        ["kubectl", "label", "--local", "-f", str(path), "tenure-validate=1", "-o", "name"],
        capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"{path}: kubectl cannot parse it: {run.stderr.strip()}")


def schema_valid(paths):
    if shutil.which("kubernetes-validate") is None:
        print("skip schema validation (pip install kubernetes-validate to enable it)")
        return
    run = subprocess.run(["kubernetes-validate", "--strict", "--quiet", *map(str, paths)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"schema validation:\n{run.stdout}{run.stderr}")


def main():
    # monitoring/ holds Prometheus rule files, not Kubernetes manifests (promtool checks them).
    paths = sorted(p for p in DEPLOY.rglob("*.yaml") if "monitoring" not in p.relative_to(DEPLOY).parts)
    for path in paths:
        try:
            docs = documents(path)
        except yaml.YAMLError as error:
            fail(f"{path}: does not parse: {error}")
            continue
        for doc in docs:
            if doc.get("kind") not in ALLOWED_KINDS:
                fail(f"{path}: kind {doc.get('kind')} is not one the in-memory API server serves")
        if path.parent.name == "rbac":
            check_rbac_file(path, docs)
        elif path.name == "example-deployment.yaml":
            check_example(path, docs)
        kubectl_parses(path)
    schema_valid(paths)
    print(f"{len(failures)} problem(s) found" if failures else "no problems found")
    print(f"{len(paths)} files checked: {'FAILED' if failures else 'all consistent'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
