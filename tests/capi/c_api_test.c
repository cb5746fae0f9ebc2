/* The C API from C99 (built with -std=c99 -pedantic -Werror): error codes and messages across
 * the boundary, a session fed by a C fill callback on a sub-communicator, callbacks, the Fortran
 * handle entry point, create/run/free/create again, failures in the host's callback.
 *
 *   mpiexec -n N c_api_test SFT_DATASET_DIR SCRATCH_DIR
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "l3/l3.h"

static int failures = 0;
static int rank = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "FAIL [rank %d] %s:%d: %s (last error: %s)\n", rank, __FILE__, __LINE__, \
              #cond, l3_last_error());                                                         \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

struct counts {
  int steps;
  int checkpoints;
  double first_loss;
  double last_loss;
};

static void count_step(const l3_step_metrics* m, void* user) {
  struct counts* c = (struct counts*)user;
  if (c->steps == 0) c->first_loss = m->loss;
  c->last_loss = m->loss;
  ++c->steps;
}

static void count_checkpoint(const l3_checkpoint_info* info, void* user) {
  struct counts* c = (struct counts*)user;
  if (info->directory != NULL && strstr(info->directory, "step-") != NULL) ++c->checkpoints;
}

/* "w:" + word, then the word reversed as the target. */
static int fill_reversals(int64_t step, int r, int ranks, l3_batch* batch, void* user) {
  static const char* const words[] = {"apple", "river", "stone", "cloud"};
  const int per_rank = *(const int*)user;
  int i;
  (void)ranks;
  for (i = 0; i < per_rank; ++i) {
    const char* word = words[(step * 3 + r + i) % 4];
    int32_t tokens[32];
    uint8_t mask[32];
    size_t n = 0;
    size_t k;
    const size_t len = strlen(word);
    tokens[n] = 'w';
    mask[n++] = 0;
    tokens[n] = ':';
    mask[n++] = 0;
    for (k = 0; k < len; ++k) {
      tokens[n] = (unsigned char)word[k];
      mask[n++] = 0;
    }
    for (k = 0; k < len; ++k) {
      tokens[n] = (unsigned char)word[len - 1 - k];
      mask[n++] = 1;
    }
    if (l3_batch_add_document(batch, tokens, mask, n) != L3_OK) return 1;
  }
  return 0;
}

static int fill_failing(int64_t step, int r, int ranks, l3_batch* batch, void* user) {
  (void)step;
  (void)r;
  (void)ranks;
  (void)user;
  l3_batch_fail(batch, "the simulation has no data for this step");
  return 1;
}

static l3_config* host_config(const char* steps) {
  const char* args[] = {"sft",  "--model",        "tiny", "--backend",    "cpu", "--seq-len",
                        "32",   "--global-batch", "4",    "--steps",      steps, "--lr",
                        "3e-3", "--log-level",    "warn", "--no-progress"};
  l3_config* config = NULL;
  CHECK(l3_config_from_args((int)(sizeof args / sizeof args[0]), args, &config) == L3_OK);
  return config;
}

int main(int argc, char** argv) {
  int size = 0;
  int provided = 0;
  int round;
  const char* data;
  const char* scratch;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 3) {
    fprintf(stderr, "usage: c_api_test SFT_DATASET_DIR SCRATCH_DIR\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  data = argv[1];
  scratch = argv[2];

  CHECK(strlen(l3_version()) > 0);

  /* Errors: codes and one-line messages, no exceptions. */
  {
    const char* bad[] = {"sft", "--model", "tiny", "--no-such-option", "1"};
    const char* wrong_phase[] = {"pretrain"};
    l3_config* config = NULL;
    CHECK(l3_config_from_args(5, bad, &config) == L3_ERROR_INPUT);
    CHECK(config == NULL);
    CHECK(strstr(l3_last_error(), "no-such-option") != NULL);
    CHECK(l3_config_from_args(1, wrong_phase, &config) == L3_ERROR_INPUT);
    CHECK(strstr(l3_last_error(), "pretrain") != NULL);
    CHECK(l3_config_from_args(0, NULL, NULL) == L3_ERROR_INPUT);
    CHECK(strstr(l3_last_error(), "out is NULL") != NULL);
    /* The DPO phase and its options. */
    {
      const char* dpo[] = {"dpo", "--init", "ckpt", "--data", "pairs", "--global-batch", "4",
                           "--beta", "0.25"};
      l3_config* dpo_config = NULL;
      CHECK(l3_config_from_args(9, dpo, &dpo_config) == L3_OK);
      CHECK(dpo_config != NULL && strcmp(l3_config_get(dpo_config, "beta"), "0.25") == 0);
      CHECK(dpo_config != NULL && l3_config_set(dpo_config, "loss", "ipo") == L3_OK);
      CHECK(dpo_config != NULL && l3_config_set(dpo_config, "loss", "kto") == L3_ERROR_INPUT);
      l3_config_free(dpo_config);
    }
    CHECK(l3_config_from_file("/no/such/file.ini", "sft", &config) == L3_ERROR_INPUT);
    CHECK(strstr(l3_last_error(), "/no/such/file.ini") != NULL);

    config = host_config("4");
    CHECK(l3_config_set(config, "lr", "fast") == L3_ERROR_INPUT);
    CHECK(strstr(l3_last_error(), "lr") != NULL);
    CHECK(l3_config_set(config, "lr", "1e-3") == L3_OK);
    CHECK(l3_config_get(config, "lr") != NULL && strcmp(l3_config_get(config, "lr"), "0.001") == 0);
    CHECK(l3_config_get(config, "no-such-option") == NULL);
    CHECK(l3_session_run(NULL, NULL) == L3_ERROR_INPUT);
    l3_config_free(config);
  }

  /* A session per half of the ranks, fed from C, created, run and freed twice. */
  for (round = 0; round < 2; ++round) {
    MPI_Comm half;
    int half_size = 0;
    int per_rank;
    char ckpt[512];
    struct counts counts = {0, 0, 0.0, 0.0};
    l3_run_summary summary;
    l3_session* session = NULL;
    l3_config* config = host_config("4");
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Comm_size(half, &half_size);
    per_rank = 4 / half_size;
    snprintf(ckpt, sizeof ckpt, "%s/c-%d-%d", scratch, round, rank % 2);
    CHECK(l3_config_set(config, "ckpt-dir", ckpt) == L3_OK);
    CHECK(l3_session_create_with_data(half, config, fill_reversals, &per_rank, &session) == L3_OK);
    CHECK(session != NULL);
    if (session != NULL) {
      CHECK(l3_session_on_step(session, count_step, &counts) == L3_OK);
      CHECK(l3_session_on_checkpoint(session, count_checkpoint, &counts) == L3_OK);
      CHECK(l3_session_run(session, &summary) == L3_OK);
      CHECK(summary.steps == 4 && summary.first_step == 0 && !summary.stopped);
      CHECK(counts.steps == 4);
      CHECK(counts.checkpoints == 1); /* the final one */
      CHECK(isfinite(summary.final_loss) && summary.final_loss == counts.last_loss);
      CHECK(l3_session_steps_done(session) == 4);
      l3_session_free(session);
    }
    l3_config_free(config);
    MPI_Comm_free(&half);
  }

  /* The Fortran entry point (an MPI_Fint communicator), with data from a prepared dataset. */
  {
    int more = 1;
    int steps = 0;
    struct counts counts = {0, 0, 0.0, 0.0};
    l3_session* session = NULL;
    l3_config* config = host_config("3");
    CHECK(l3_config_set(config, "data", data) == L3_OK);
    CHECK(l3_config_set(config, "seq-len", "256") == L3_OK); /* chat-formatted records */
    CHECK(l3_session_create_f(MPI_Comm_c2f(MPI_COMM_WORLD), config, &session) == L3_OK);
    CHECK(session == NULL || l3_session_on_step(session, count_step, &counts) == L3_OK);
    while (session != NULL && more) {
      CHECK(l3_session_step(session, &more) == L3_OK);
      steps += more;
    }
    CHECK(steps == 3);
    CHECK(counts.steps == 3 && isfinite(counts.last_loss));
    l3_session_free(session);
    l3_config_free(config);
  }

  /* Failures reach every rank as codes with the reason. */
  {
    l3_session* session = NULL;
    l3_config* config = host_config("3");
    CHECK(l3_config_set(config, "data", "/no/such/dataset") == L3_OK);
    CHECK(l3_session_create(MPI_COMM_WORLD, config, &session) == L3_ERROR_INPUT);
    CHECK(session == NULL);
    if (rank == 0) CHECK(strstr(l3_last_error(), "/no/such/dataset") != NULL);
    l3_config_free(config);

    config = host_config("3");
    CHECK(l3_session_create_with_data(MPI_COMM_WORLD, config, fill_failing, NULL, &session) ==
          L3_OK);
    CHECK(l3_session_run(session, NULL) == L3_ERROR_INPUT);
    CHECK(strstr(l3_last_error(), "no data for this step") != NULL);
    l3_session_free(session);
    l3_config_free(config);
  }

  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("%s: %d failure(s) over %d ranks\n", failures ? "FAIL" : "ok", failures, size);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
