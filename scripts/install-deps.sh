#!/usr/bin/env bash
# Install the Debian/Ubuntu packages llama3-hpc builds against. Idempotent: packages already
# present are left alone and apt is not touched when nothing is missing. Runs as root or via sudo.
#
#   scripts/install-deps.sh            install what is missing
#   scripts/install-deps.sh --check    list what is missing, install nothing (exit 1 if any)
#   scripts/install-deps.sh --test-tools   also what some tests need and skip without: a local
#                                          Slurm (tests/slurm), shellcheck (lint/shell), Chromium
#                                          (cli/report_chromium), Python's protobuf
#                                          (fault/tensorboard), ccache (.ci/run's two
#                                          builds); CI uses it
#   scripts/install-deps.sh --spack    print the equivalent Spack line for clusters and exit
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  mpich libmpich-dev            # MPI (any MPI-3 works; Debian's MPICH is what CI tests)
  libhdf5-mpich-dev             # parallel HDF5 built against MPICH
  libboost-program-options-dev  # CLI and config files
  libfmt-dev                    # logging
  catch2                        # unit tests (v2 on Debian 12, v3 on newer releases)
  libopenblas-dev               # CPU SGEMM
  libopenblas-openmp-dev        # ... the OpenMP-threaded build, which shares our thread pool
  libpcre2-dev                  # tokenizer pre-split regex (\p{L}, \p{N})
  nlohmann-json3-dev            # JSONL, config.json, safetensors headers, manifests
  libssl-dev                    # SHA-256 (OpenSSL libcrypto): tokenizer and checkpoint hashes
  zlib1g-dev                    # .jsonl.gz input
  libxxhash-dev                 # xxHash64 checksums of checkpoint slices
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (--tensorboard)
  python3                       # tests/spack/check_package.py, JSON checks of tests/cli
)
test_tools=(
  slurmctld slurmd slurm-client munge   # tests/slurm: the job scripts under a real Slurm
  shellcheck                            # lint/shell: jobs/ and scripts/
  python3-protobuf                      # fault/tensorboard: decodes the event files
  chromium                              # cli/report_chromium: the report in a headless browser
  ccache                                # .ci/run: its two builds share the library's objects
)

spack_line='spack repo add ./spack && spack install llama3-hpc  # or by hand: spack install mpich hdf5+mpi boost+program_options fmt catch2 openblas pcre2 nlohmann-json openssl zlib xxhash protobuf cmake (+ cuda cudnn nccl for the GPU backend)'

case "${1:-}" in
  --spack) echo "$spack_line"; exit 0 ;;
  --test-tools) packages+=("${test_tools[@]}"); shift ;;
  --check|"") ;;
  -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
  *) echo "install-deps.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps.sh: not a Debian/Ubuntu system; install the equivalents yourself, e.g. with Spack:" >&2
  echo "  $spack_line" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps.sh: all ${#packages[@]} packages present"
  echo "on a cluster without apt: $spack_line"
  exit 0
fi

if [[ "${1:-}" == "--check" ]]; then
  echo "missing: ${missing[*]}"
  exit 1
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 2; }
  sudo=(sudo)
fi

echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps.sh: done"
echo "on a cluster without apt: $spack_line"
