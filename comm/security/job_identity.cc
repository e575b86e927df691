#include "comm/security/job_identity.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "comm/security/crypto.h"
#include "common/error.h"

namespace gz {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

std::string JobIdentity::mac_key() const {
  if (secret()) return token;
  return "gradzip-public-job-key/" + id;
}

std::string JobIdentity::describe() const {
  return "job " + (id.empty() ? std::string("(unnamed)") : id) + " (" + source + ")";
}

JobIdentity job_identity_from_token(std::string token) {
  // The handshake gives an eavesdropper a proof to test guesses against.
  if (const std::string why = job_token_weakness(token); !why.empty())
    GZ_THROW(InvalidArgument, "GRADZIP_JOB_TOKEN ", why, "; ", kJobTokenAdvice);
  JobIdentity j;
  j.id = crypto::to_hex(crypto::as_bytes(crypto::sha256("gradzip job id\n" + token))).substr(0, 16);
  j.token = std::move(token);
  j.source = "GRADZIP_JOB_TOKEN";
  return j;
}

JobIdentity job_identity_from_env(bool warn_without_token) {
  if (std::string token = env("GRADZIP_JOB_TOKEN"); !token.empty()) return job_identity_from_token(std::move(token));
  JobIdentity j;
  j.source = "nothing";
  const std::string slurm = env("SLURM_JOB_ID");
  if (!slurm.empty()) {
    j.id = "slurm-" + slurm + "." + env("SLURM_STEP_ID");
    j.source = "SLURM_JOB_ID";
  } else if (const std::string ns = env("PMIX_NAMESPACE"); !ns.empty()) {
    j.id = "pmix-" + ns;
    j.source = "PMIX_NAMESPACE";
  } else if (const std::string ompi = env("OMPI_MCA_ess_base_jobid"); !ompi.empty()) {
    j.id = "ompi-" + ompi;
    j.source = "OMPI_MCA_ess_base_jobid";
  } else if (const std::string run = env("TORCHELASTIC_RUN_ID"); !run.empty() && run != "none") {
    j.id = "torchelastic-" + run;
    j.source = "TORCHELASTIC_RUN_ID";
  }
  if (j.id.size() > 64) j.id = crypto::to_hex(crypto::as_bytes(crypto::sha256(j.id))).substr(0, 16);
  if (!warn_without_token) return j;
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr,
                 "gradzip: GRADZIP_JOB_TOKEN is not set: the rendezvous store tells jobs apart by %s only, and "
                 "anyone who can reach MASTER_ADDR:MASTER_PORT can join this job. Export the same random token on "
                 "every rank (export GRADZIP_JOB_TOKEN=$(head -c16 /dev/urandom | xxd -p)); gradzip-run sets one.\n",
                 j.id.empty() ? "world size" : j.source.c_str());
  });
  return j;
}

std::string new_job_token() { return crypto::to_hex(crypto::random_bytes(16)); }

}  // namespace gz
