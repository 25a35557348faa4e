#!/usr/bin/env bash
# Open MPI's launch agent (plm_rsh_agent) for the hosts of scripts/hosts.sh: called as ssh
# would be, `host_agent.sh HOST COMMAND...`, it runs COMMAND on that host.
exec "$(dirname "${BASH_SOURCE[0]}")/hosts.sh" exec "$@"
