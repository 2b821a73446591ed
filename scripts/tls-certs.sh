#!/usr/bin/env bash
# Makes a private CA and one certificate per node name, for a TLS cluster (README, "TLS").
#
#   scripts/tls-certs.sh DIR NAME[=SAN,SAN...] ...
#
# DIR/ca.crt (+ ca.key, kept for signing more) and DIR/NAME.crt + DIR/NAME.key for each
# NAME. SANs are IP addresses or DNS names the node is reached at (default: 127.0.0.1 and
# localhost). Keys are P-256, certificates valid for DAYS (env, default 825). Needs openssl.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DIR NAME[=SAN,SAN...] ..." >&2
    exit 2
fi
dir=$1
shift
days=${DAYS:-825}
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.key" ]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$dir/ca.key" -sha256 -days "$days" -subj "/CN=sift cluster CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$dir/ca.crt"
fi
for spec in "$@"; do
    name=${spec%%=*}
    sans=127.0.0.1,localhost
    [ "$spec" != "$name" ] && sans=${spec#*=}
    alt=""
    IFS=, read -ra entries <<<"$sans"
    for entry in "${entries[@]}"; do
        if [[ $entry =~ ^[0-9.]+$ || $entry == *:* ]]; then alt+="IP:$entry,"; else alt+="DNS:$entry,"; fi
    done
    alt=${alt%,}
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key" 2>/dev/null
    openssl req -new -key "$dir/$name.key" -subj "/CN=$name" -out "$dir/$name.csr"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days "$days" -sha256 -out "$dir/$name.crt" -extfile <(printf '%s\n' \
        "subjectAltName=$alt" "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=serverAuth,clientAuth") 2>/dev/null
    rm -f "$dir/$name.csr"
    echo "$dir/$name.crt ($alt)"
done
chmod 0644 "$dir"/*.crt
