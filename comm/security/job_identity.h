// Which job a rank belongs to, and the secret that proves it.
//
// GRADZIP_JOB_TOKEN is the job's secret: the same value on every rank, known
// to nobody else (gradzip-run generates one per job; under torchrun, mpirun or
// Slurm export one on every node, e.g.
//     export GRADZIP_JOB_TOKEN=$(head -c16 /dev/urandom | xxd -p)
// ). The Store's handshake proves it (challenge-response, comm/store/
// store_handshake.h) and the values ranks publish are tagged with it
// (comm/store/sealed_store.h).
//
// Without a token the job still has an identity, so that two jobs on one
// MASTER_PORT refuse each other instead of mixing: the launcher's job id
// (SLURM_JOB_ID and SLURM_STEP_ID, PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid,
// TORCHELASTIC_RUN_ID), or none. It is public: it keeps honest jobs apart and
// catches corruption, but anyone who can reach the store can claim it, and a
// warning says so once per process.
#pragma once

#include <string>

#include "comm/security/job_token.h"

namespace gz {

struct JobIdentity {
  std::string token;   ///< the secret (GRADZIP_JOB_TOKEN); empty when unset
  std::string id;      ///< public name: 16 hex digits of the token's hash, else the launcher's job id ("" if none)
  std::string source;  ///< where `id` came from: "GRADZIP_JOB_TOKEN", "SLURM_JOB_ID", ..., or "nothing"

  /// Whether the job has a secret (strangers are kept out).
  bool secret() const { return !token.empty(); }
  /// The key of the handshake proofs and the value tags: the token, or
  /// without one a public key derived from `id`.
  std::string mac_key() const;
  /// "job 3fa2c1d0e5b6a798 (GRADZIP_JOB_TOKEN)", for messages.
  std::string describe() const;
};

/// From GRADZIP_JOB_TOKEN, else the launcher's variables (see above). Throws
/// InvalidArgument for a weak token (job_token.h). Without a token it
/// prints, once per process, that strangers are not kept out of gradzip's own
/// store (unless told not to: a store gradzip does not host).
JobIdentity job_identity_from_env(bool warn_without_token = true);

/// The identity a token gives (tests); InvalidArgument for a weak token.
JobIdentity job_identity_from_token(std::string token);

/// A new random token (32 hex digits: 128 bits from the kernel).
std::string new_job_token();

}  // namespace gz
