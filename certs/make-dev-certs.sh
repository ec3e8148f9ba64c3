#!/usr/bin/env bash
# make-dev-certs.sh — a local development CA and a server certificate for localhost / 127.0.0.1 / ::1,
# made with openssl, for `unmask serve --tls-cert ... --tls-key ...` (https:// and wss://).
#
#   certs/make-dev-certs.sh [OUT_DIR]        (default: certs/dev)
#
# Writes OUT_DIR/ca.pem + ca.key (the CA: trust ca.pem in your browser / client to avoid warnings),
# OUT_DIR/server.pem (server certificate followed by the CA certificate: the chain to serve) and
# OUT_DIR/server.key. Keys are EC P-256, the server certificate is valid 397 days, the CA 10 years.
# Never use these for anything but local development: see certs/README.md for real certificates.
set -euo pipefail

out="${1:-$(dirname "$0")/dev}"
mkdir -p "$out"
cd "$out"
umask 077

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# 1. the development CA
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout ca.key -out ca.pem -days 3650 -sha256 \
  -subj "/CN=unmask local development CA" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash" 2>/dev/null

# 2. the server key + certificate signing request
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout server.key -out "$tmp/server.csr" -subj "/CN=localhost" 2>/dev/null

cat > "$tmp/server.ext" <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
authorityKeyIdentifier=keyid
subjectKeyIdentifier=hash
EOF

# 3. the CA signs it
openssl x509 -req -in "$tmp/server.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -CAserial "$tmp/ca.srl" \
  -out "$tmp/server.crt" -days 397 -sha256 -extfile "$tmp/server.ext" 2>/dev/null
cat "$tmp/server.crt" ca.pem > server.pem
chmod 600 ca.key server.key
chmod 644 ca.pem server.pem

openssl verify -CAfile ca.pem "$tmp/server.crt" >/dev/null

echo "wrote $(pwd)/{ca.pem,ca.key,server.pem,server.key}"
echo "run:   unmask serve --tls-cert $(pwd)/server.pem --tls-key $(pwd)/server.key"
echo "trust: $(pwd)/ca.pem (browser certificate settings, or NODE_EXTRA_CA_CERTS / curl --cacert)"
