#!/usr/bin/env bash
# Lints deploy/: the Dockerfile with hadolint, the systemd unit with `systemd-analyze verify`
# (when systemd is installed), and compose.yaml's cluster wiring (each node listens on its own
# fixed address, its health check probes that address, the others join the first). Images are
# not built here: CI machines reach no image registry.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${SIFT_CLIENTS_PYTHON:-$(scripts/client-venv.sh)}
bin=$(dirname "$python")
"$bin/hadolint" deploy/Dockerfile
echo "lint-deploy: deploy/Dockerfile passes hadolint"
if command -v systemd-analyze >/dev/null; then
  unit=$(mktemp -d)/sift.service
  # verify wants ExecStart's binary to exist: point it at a stand-in executable
  sed "s|/usr/local/bin/sift|/bin/true|" deploy/sift.service > "$unit"
  systemd-analyze verify "$unit"
  echo "lint-deploy: deploy/sift.service passes systemd-analyze verify"
else
  echo "lint-deploy: systemd-analyze is missing: the unit is not verified" >&2
fi
"$python" - <<'PY'
import ipaddress, sys, yaml

compose = yaml.safe_load(open("deploy/compose.yaml"))
subnet = ipaddress.ip_network(compose["networks"]["sift"]["ipam"]["config"][0]["subnet"])
services = compose["services"]
problems = []
first = None
for name, service in services.items():
    env = service["environment"]
    address = service["networks"]["sift"]["ipv4_address"]
    if ipaddress.ip_address(address) not in subnet:
        problems.append(f"{name}: {address} is outside {subnet}")
    if env["SIFT_LISTEN"] != f"{address}:7700":
        problems.append(f"{name}: SIFT_LISTEN {env['SIFT_LISTEN']} is not its address {address}")
    if env["SIFT_INTERNAL_LISTEN"] != f"{address}:7701":
        problems.append(f"{name}: SIFT_INTERNAL_LISTEN is not {address}:7701")
    if f"http://{address}:7700/healthz" not in service["healthcheck"]["test"]:
        problems.append(f"{name}: the health check does not probe {address}")
    for key in ("SIFT_CLUSTER_SECRET", "SIFT_ADMIN_KEY"):
        if key not in env:
            problems.append(f"{name}: {key} is not set")
    if first is None:
        first = env["SIFT_INTERNAL_LISTEN"]
        if "SIFT_JOIN" in env:
            problems.append(f"{name}: the first node must bootstrap, not join")
    elif env.get("SIFT_JOIN") != first:
        problems.append(f"{name}: SIFT_JOIN {env.get('SIFT_JOIN')} is not the first node's {first}")
    if not any(volume.endswith(":/var/lib/sift") for volume in service["volumes"]):
        problems.append(f"{name}: no volume on /var/lib/sift")
if len(services) != 3:
    problems.append(f"{len(services)} services, not 3")
if problems:
    sys.exit("lint-deploy: deploy/compose.yaml:\n  " + "\n  ".join(problems))
print("lint-deploy: deploy/compose.yaml wires a three-node cluster")
PY
