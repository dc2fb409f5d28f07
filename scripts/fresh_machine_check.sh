#!/usr/bin/env bash
# Runs the README's two commands on a fresh Debian 12, as a new user would: builds a clean root
# with `debootstrap --variant=minbase bookworm`, copies a clean checkout (`git archive` of a ref,
# so no build dirs or uncommitted files) and ../shared beside it, copies in only what reaching the
# package registries needs from this host (its Debian mirror and apt settings, extra CA
# certificates, pip configuration, resolv.conf), then runs in a chroot
#   bash scripts/demo.sh     and     bash scripts/test.sh
# logging each with its wall time and exit code, and prints a summary (the demo's held-out
# perplexity before -> after, ctest's totals). Exits non-zero if either command fails.
#
#   sudo bash scripts/fresh_machine_check.sh [--only demo|test] [--keep] [--root DIR]
#                                            [--logs DIR] [--ref REV] [-- CTEST_ARGS...]
#
#   --only demo|test  run one of the two commands (default: both, demo first)
#   --keep            keep the root afterwards (default: removed; the logs are always kept)
#   --root DIR        where the root is built (default /var/tmp/zof-fresh-root); a DIR that
#                     exists must be empty or a root this script made (it holds .zof-fresh-root)
#   --logs DIR        where the logs go (default: DIR-logs beside the root)
#   --ref REV         the commit to check out (default HEAD)
#   --mirror URL      the Debian mirror (default: this host's, from /etc/apt/sources.list(.d))
#   -- ARGS           passed on to `bash scripts/test.sh`, i.e. to ctest (e.g. -- -L unit)
#
# Needs root (debootstrap, chroot, mounts); installs debootstrap with apt-get if it is missing.
# Every heavy step runs under `nice -n 19 ionice -c3`. Idempotent: a run unmounts and removes
# what an earlier run left in DIR, and nothing outside DIR and the log folder is written
# (besides installing debootstrap on the host).
set -euo pipefail

die() { echo "fresh_machine_check: error: $*" >&2; exit 2; }
say() { echo "fresh_machine_check: $*"; }

REPO=$(cd "$(dirname "$0")/.." && pwd)
ONLY="" KEEP=0 ROOT=/var/tmp/zof-fresh-root LOGS="" REF=HEAD MIRROR="" SHARED="$REPO/../shared"
TEST_ARGS=()
while (($#)); do
  case "$1" in
    --only) [ $# -ge 2 ] || die "--only needs demo or test"
            case "$2" in demo|test) ONLY=$2 ;; *) die "--only must be demo or test, not '$2'" ;; esac
            shift 2 ;;
    --only=*) set -- --only "${1#--only=}" "${@:2}" ;;
    --keep) KEEP=1; shift ;;
    --root) [ $# -ge 2 ] || die "--root needs a directory"; ROOT=$2; shift 2 ;;
    --root=*) ROOT=${1#--root=}; shift ;;
    --logs) [ $# -ge 2 ] || die "--logs needs a directory"; LOGS=$2; shift 2 ;;
    --logs=*) LOGS=${1#--logs=}; shift ;;
    --ref) [ $# -ge 2 ] || die "--ref needs a revision"; REF=$2; shift 2 ;;
    --ref=*) REF=${1#--ref=}; shift ;;
    --mirror) [ $# -ge 2 ] || die "--mirror needs a URL"; MIRROR=$2; shift 2 ;;
    --mirror=*) MIRROR=${1#--mirror=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; TEST_ARGS=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot and mounts need it)"

# --- Where: the root must be a dedicated directory, never one that holds anything else. -----------
case "$ROOT" in *[[:space:]]*) die "--root must not contain whitespace: '$ROOT'" ;; esac
ROOT=$(realpath -m -- "$ROOT")
LOGS=$(realpath -m -- "${LOGS:-$ROOT-logs}")
SHARED=$(realpath -m -- "$SHARED")
case "$ROOT" in
  /|/bin|/boot|/dev|/etc|/home|/lib*|/media|/mnt|/opt|/proc|/root|/run|/sbin|/srv|/sys|/tmp|/usr|/var|/var/tmp|/work)
    die "--root $ROOT is a system directory; name a directory of its own" ;;
esac
for p in "$REPO" "$SHARED" "$LOGS"; do
  case "$p/" in "$ROOT"/*) die "--root $ROOT would contain $p" ;; esac
done
MARK="$ROOT/.zof-fresh-root"
if [ -e "$ROOT" ] && [ -n "$(ls -A "$ROOT" 2>/dev/null)" ] && [ ! -e "$MARK" ]; then
  die "$ROOT exists, is not empty and was not made by this script (no .zof-fresh-root); refusing to touch it"
fi
[ -d "$SHARED/assets" ] || die "no shared assets at $SHARED/assets (the README's commands need ../shared/assets)"
COMMIT=$(git -C "$REPO" rev-parse --verify -q "$REF^{commit}") || die "--ref '$REF' is not a commit of $REPO"

# Mirror: this host's Debian mirror (the URIs of its bookworm sources), unless --mirror says.
host_sources() {  # active apt sources files that name a Debian archive
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -Eq '^[^#]*(https?|file)://[^ ]*/debian' "$f" && echo "$f"
  done
  return 0
}
if [ -z "$MIRROR" ]; then
  for f in $(host_sources); do
    MIRROR=$(grep -Eo '^[^#]*(https?|file)://[^ ]*/debian/?( |$)' "$f" | grep -Eo '(https?|file)://[^ ]*' | head -1)
    [ -n "$MIRROR" ] && break
  done
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}

NICE=(nice -n 19 ionice -c3)
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

# --- Mounts: found from /proc/self/mounts, undone deepest first, checked before any removal. ----
mounts_under() { awk -v r="$ROOT" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/self/mounts | sort -r; }
unmount_all() {
  local m
  for m in $(mounts_under); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  [ -z "$(mounts_under)" ]
}
remove_root() {
  unmount_all || die "cannot unmount everything under $ROOT; left it in place"
  [ -e "$ROOT" ] || return 0
  [ -z "$(ls -A "$ROOT" 2>/dev/null)" ] || [ -e "$MARK" ] || die "$ROOT has no .zof-fresh-root; not removing it"
  "${NICE[@]}" rm -rf --one-file-system -- "$ROOT"
}
FINISHED=0
cleanup() {
  local rc=$?
  unmount_all || echo "fresh_machine_check: warning: mounts left under $ROOT" >&2
  if [ "$KEEP" = 0 ] && [ -e "$MARK" ]; then
    remove_root || true
  elif [ -e "$ROOT" ]; then
    echo "fresh_machine_check: kept the root: chroot $ROOT /bin/bash" >&2
  fi
  [ "$FINISHED" = 1 ] || echo "fresh_machine_check: stopped early (exit $rc); logs in $LOGS" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

elapsed() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { d = e - s; printf "%dm%02ds", d / 60, d % 60 }'; }

note "fresh_machine_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $COMMIT ($REF), root $ROOT, mirror $MIRROR"
[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
  note "  note: $REPO has uncommitted changes; they are not part of the check (it uses $COMMIT)"

# --- 1. A clean Debian 12 root. ----------------------------------------------------------------
t=$(date +%s.%N)
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap on this host"
  "${NICE[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${NICE[@]}" apt-get install -y -qq --no-install-recommends debootstrap
fi
remove_root
mkdir -p "$ROOT"
touch "$MARK"
say "debootstrap --variant=minbase bookworm $ROOT $MIRROR (log: $LOGS/debootstrap.log)"
if ! "${NICE[@]}" debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" > "$LOGS/debootstrap.log" 2>&1; then
  tail -20 "$LOGS/debootstrap.log" >&2
  die "debootstrap failed (log: $LOGS/debootstrap.log)"
fi
note "debootstrap: $(elapsed "$t"), exit 0"

# --- 2. The checkout, ../shared, and what reaching the registries needs from this host. --------
t=$(date +%s.%N)
copied=()
mkdir -p "$ROOT/work/zof"
git -C "$REPO" archive --format=tar "$COMMIT" | tar -x -C "$ROOT/work/zof"
cp -a "$SHARED" "$ROOT/work/shared"
# apt: the host's Debian sources replace debootstrap's one-line sources.list (so the root gets
# bookworm-updates and bookworm-security as a real install does), and the apt settings that say
# how the mirror is reached (proxies, TLS, release-date checks) go along; the rest (an image's
# own tweaks) does not.
srcs=$(host_sources)
if [ -n "$srcs" ]; then
  rm -f "$ROOT/etc/apt/sources.list"
  for f in $srcs; do
    case "$f" in /etc/apt/sources.list) cp "$f" "$ROOT/etc/apt/sources.list" ;;
                 *) cp "$f" "$ROOT/etc/apt/sources.list.d/" ;; esac
    copied+=("$f")
  done
fi
for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/*; do
  [ -f "$f" ] && grep -Eiq '^[^/#]*(proxy|Check-Valid-Until|Check-Date|Verify-P|CaInfo|SslCert|SslKey)' "$f" || continue
  cp "$f" "$ROOT$f"; copied+=("$f")
done
# CA certificates: the host's extra ones (ca-certificates' postinst adds them to the bundle when
# setup.sh's packages pull it in) and the bundle itself for anything that runs before that.
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
  copied+=(/usr/local/share/ca-certificates)
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$ROOT/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"; copied+=(/etc/ssl/certs/ca-certificates.crt)
fi
# pip: the system-wide and root's configuration files.
for f in /etc/pip.conf /etc/xdg/pip/pip.conf; do
  [ -f "$f" ] || continue
  mkdir -p "$(dirname "$ROOT$f")"; cp -L "$f" "$ROOT$f"; copied+=("$f")
done
for f in "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
  [ -f "$f" ] || continue
  d="$ROOT/root/${f#"$HOME"/}"; mkdir -p "$(dirname "$d")"; cp -L "$f" "$d"; copied+=("$f")
done
# Names: resolv.conf and hosts.
for f in /etc/resolv.conf /etc/hosts; do
  [ -e "$f" ] || continue
  rm -f "$ROOT$f"; cp -L "$f" "$ROOT$f"; copied+=("$f")
done
# No package's maintainer script may start a service of the host from inside the root.
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod 755 "$ROOT/usr/sbin/policy-rc.d"
note "copied in: ${copied[*]:-nothing}"

# Mounts: proc, sys, a /dev, its pts and shm (Open MPI's shared-memory transport uses /dev/shm).
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys"
mount --bind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$ROOT/dev/pts" 2>/dev/null ||
  mount --bind /dev/pts "$ROOT/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$ROOT/dev/shm"
note "prepare: $(elapsed "$t"), exit 0"

# --- 3. The README's commands, in the root, with a new user's environment. ---------------------
ENV=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb
     USER=root LOGNAME=root SHELL=/bin/bash)
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [ -n "${!v:-}" ] && ENV+=("$v=${!v}")
done
declare -A RC TIME
run_in_root() {  # NAME COMMAND...
  local name=$1; shift
  local log="$LOGS/$name.log" t0 rc=0
  say "$name: $* (log: $log)"
  t0=$(date +%s.%N)
  "${NICE[@]}" chroot "$ROOT" /usr/bin/env -i "${ENV[@]}" /bin/bash -c 'cd /work/zof && exec "$@"' bash "$@" \
    < /dev/null > "$log" 2>&1 || rc=$?
  RC[$name]=$rc TIME[$name]=$(elapsed "$t0")
  note "$name: ${TIME[$name]}, exit $rc  ($*)"
  [ "$rc" = 0 ] || { echo "--- last lines of $log:"; tail -25 "$log"; } | tee -a "$SUMMARY" >&2
}
[ "$ONLY" = test ] || run_in_root demo bash scripts/demo.sh
[ "$ONLY" = demo ] || run_in_root test bash scripts/test.sh "${TEST_ARGS[@]}"

# --- 4. Summary. -------------------------------------------------------------------------------
if [ -n "${RC[demo]:-}" ]; then
  ev=$(grep -E '^\{.*"eval"' "$LOGS/demo.log" | tail -1 |
       sed -nE 's/.*"after":([^,}]*).*"before":([^,}]*).*"metric":"([^"]*)".*/\3 \2 -> \1/p')
  note "demo: held-out ${ev:-(no final summary line)}"
  grep -E '^eval @ step' "$LOGS/demo.log" | sed 's/^/  /' | tee -a "$SUMMARY"
  miss=$(grep -E '^setup: installing' "$LOGS/demo.log" | sed 's/^/  /') || true
  [ -z "$miss" ] || note "$miss"
fi
if [ -n "${RC[test]:-}" ]; then
  tot=$(grep -E 'tests passed.*out of' "$LOGS/test.log" | tail -1)
  note "test: ${tot:-(no ctest summary line)}"
  grep -E '^Total Test time|^The following tests FAILED|^[[:space:]]+[0-9]+ - ' "$LOGS/test.log" |
    sed 's/^/  /' | tee -a "$SUMMARY" || true
fi
note "logs: $LOGS"
FINISHED=1
status=0
for n in "${!RC[@]}"; do [ "${RC[$n]}" = 0 ] || status=1; done
exit "$status"
