#!/bin/sh
# A berth DNS-01 hook (docs/acme.md) for a provider with an HTTP API: berth sets
# BERTH_ACME_ACTION (present|cleanup), BERTH_ACME_DOMAIN, BERTH_ACME_FQDN and BERTH_ACME_VALUE,
# and adds DNS_API and DNS_API_TOKEN from dns-hook.env. The token goes to curl on its standard
# input (--config -), so it never shows on a command line. Exit 0 on success.
set -eu
case "$BERTH_ACME_ACTION" in
  present) method=PUT ;;
  cleanup) method=DELETE ;;
  *) echo "unknown action $BERTH_ACME_ACTION" >&2; exit 2 ;;
esac
printf 'header = "Authorization: Bearer %s"\n' "$DNS_API_TOKEN" |
  curl --silent --show-error --fail --config - -X "$method" \
    -H 'Content-Type: application/json' \
    --data "{\"name\":\"$BERTH_ACME_FQDN\",\"value\":\"$BERTH_ACME_VALUE\",\"ttl\":60}" \
    "$DNS_API"
