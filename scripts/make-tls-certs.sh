#!/usr/bin/env bash
# Makes a throw-away CA and certificates for trying tritond over TLS (not for production):
#   DIR/ca.crt, ca.key           the CA: clients trust ca.crt; --*-root-cert=ca.crt checks client certificates
#   DIR/server.crt, server.key   for localhost, 127.0.0.1 and ::1 (more names: SERVER_SAN=DNS:host,IP:10.0.0.5)
#   DIR/client.crt, client.key   CN=tritond-client, a client certificate for mutual TLS
#   DIR/admin.crt, admin.key     CN=tritond-admin,O=ops, for --http-restricted-api-subject and friends
# Usage: bash scripts/make-tls-certs.sh [DIR]    (default DIR: ./tls; DAYS=30 sets the validity)
set -euo pipefail
dir=${1:-tls}
days=${DAYS:-30}
san="DNS:localhost,IP:127.0.0.1,IP:::1${SERVER_SAN:+,$SERVER_SAN}"
mkdir -p "$dir"
cd "$dir"
umask 077   # private keys readable by their owner only

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -out ca.crt -days "$days" -subj "/CN=tritond throw-away CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

leaf() {  # leaf NAME SUBJECT EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "$2"
  printf '%b\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
leaf server "/CN=localhost" "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=$san"
leaf client "/CN=tritond-client" "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth"
leaf admin "/O=ops/CN=tritond-admin" "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth"
rm -f ca.srl
chmod 644 ./*.crt
echo "certificates in $(pwd): ca.crt, server.crt/.key, client.crt/.key, admin.crt/.key (valid $days days)"
