/* llama3-hpc's C API (C99): the C++ API of l3/l3.hpp behind opaque handles, for C hosts and,
 * through MPI_Fint communicators, Fortran ones. See docs/embedding.md.
 *
 *   l3_config* config = NULL;
 *   const char* args[] = {"sft", "--config", "sft.ini"};
 *   if (l3_config_from_args(3, args, &config) != L3_OK) fprintf(stderr, "%s\n", l3_last_error());
 *   l3_session* session = NULL;
 *   l3_session_create(comm, config, &session);      collective over comm
 *   l3_session_run(session, NULL);
 *   l3_session_free(session);
 *   l3_config_free(config);
 *
 * Every function returning int returns L3_OK (0) or an error code: L3_ERROR_INTERNAL (1) or
 * L3_ERROR_INPUT (2, a bad option, value or file: fix and retry), with the message in
 * l3_last_error() (this thread's last failure). No exception crosses this boundary. Session
 * functions are collective over the session's communicator unless they say otherwise.
 */
#ifndef L3_L3_H
#define L3_L3_H
/* NOLINTBEGIN: a C header, in C's idioms (typedef struct, <stdint.h>, snake_case types) */

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define L3_EXPORT
#else
#define L3_EXPORT __attribute__((visibility("default")))
#endif

enum l3_status {
  L3_OK = 0,
  L3_ERROR_INTERNAL = 1, /* a failed system/MPI call, a bug, or another rank's failure */
  L3_ERROR_INPUT = 2     /* bad usage or input: the message names the option or file */
};

typedef struct l3_config l3_config;
typedef struct l3_session l3_session;

/* One optimizer step, global over the session's ranks. Values not measured are NaN. */
typedef struct l3_step_metrics {
  int64_t step; /* steps done, this one included */
  int64_t total_steps;
  double loss;
  double lr;
  double grad_norm;
  int64_t tokens;
  double tokens_per_s;
  double mfu;      /* NaN when the peak is not known */
  double accuracy; /* reward and DPO runs; NaN for SFT */
  double margin;   /* reward and DPO runs; NaN for SFT */
  double step_ms;
  double data_wait_ms;
  int skipped;   /* non-finite loss or gradient: no update */
  double reward; /* GRPO: the step's mean reward; NaN for the other phases */
} l3_step_metrics;

typedef struct l3_eval_metrics {
  int64_t step;
  double loss; /* SFT and DPO */
  double perplexity;
  double accuracy; /* reward and DPO */
  double margin;
  int64_t samples; /* tokens (SFT), pairs (reward, DPO) or prompts (GRPO) evaluated */
  double reward;   /* GRPO: the mean reward of greedy completions; NaN for the other phases */
} l3_eval_metrics;

typedef struct l3_checkpoint_info {
  int64_t step;
  const char* directory; /* valid during the callback / until the next call on the session */
  int64_t bytes;
  double seconds;
} l3_checkpoint_info;

typedef struct l3_run_summary {
  int64_t steps;      /* done by this run */
  int64_t first_step; /* done before it (resumed) */
  int stopped;        /* stopped early with a checkpoint (request or deadline) */
  int64_t skipped_steps;
  double final_loss; /* NaN without a step */
  double seconds;
  double tokens_per_s;
} l3_run_summary;

typedef void (*l3_step_callback)(const l3_step_metrics* metrics, void* user);
typedef void (*l3_eval_callback)(const l3_eval_metrics* metrics, void* user);
typedef void (*l3_checkpoint_callback)(const l3_checkpoint_info* info, void* user);

/* Training data from memory (see l3::DataSource): called on every rank once per step with the
 * 0-based step; add this rank's documents (SFT) or pairs (reward) to `batch`, return 0, or
 * non-zero to fail the run (then set a message with l3_batch_fail). */
typedef struct l3_batch l3_batch;
typedef int (*l3_fill_callback)(int64_t step, int rank, int ranks, l3_batch* batch, void* user);
/* loss_mask[t] = 1: token t is a training target. */
L3_EXPORT int l3_batch_add_document(l3_batch* batch, const int32_t* tokens,
                                    const uint8_t* loss_mask, size_t length);
L3_EXPORT int l3_batch_add_pair(l3_batch* batch, const int32_t* chosen, size_t chosen_length,
                                const int32_t* rejected, size_t rejected_length, float margin);
L3_EXPORT void l3_batch_fail(l3_batch* batch, const char* message);

/* "0.1.0": the library in use. */
L3_EXPORT const char* l3_version(void);
/* The message of this thread's last failed call ("" if none). Valid until this thread's next
 * failing call. */
L3_EXPORT const char* l3_last_error(void);

/* argv: the phase ("sft", "reward", "dpo" or "grpo") then options, as on the command line. */
L3_EXPORT int l3_config_from_args(int argc, const char* const* argv, l3_config** out);
/* phase: "sft", "reward", "dpo" or "grpo"; path: 'key = value' lines. */
L3_EXPORT int l3_config_from_file(const char* path, const char* phase, l3_config** out);
/* One option, as on the command line ("lr", "1e-5"; switches take "true" or "false"). */
L3_EXPORT int l3_config_set(l3_config* config, const char* option, const char* value);
/* The option's value as text, NULL on error; valid until the next call on this config. */
L3_EXPORT const char* l3_config_get(l3_config* config, const char* option);
L3_EXPORT void l3_config_free(l3_config* config);

/* Collective over comm. fill may be NULL (the data comes from --data). */
L3_EXPORT int l3_session_create(MPI_Comm comm, const l3_config* config, l3_session** out);
L3_EXPORT int l3_session_create_with_data(MPI_Comm comm, const l3_config* config,
                                          l3_fill_callback fill, void* user, l3_session** out);
/* The same for Fortran: comm is an MPI_Fint (e.g. MPI_COMM_WORLD from Fortran's mpi module). */
L3_EXPORT int l3_session_create_f(MPI_Fint comm, const l3_config* config, l3_session** out);
/* Waits for a checkpoint still being written; NULL is ignored. */
L3_EXPORT void l3_session_free(l3_session* session);

/* summary may be NULL. */
L3_EXPORT int l3_session_run(l3_session* session, l3_run_summary* summary);
/* *more = 1 after a step, 0 once every step is done or the run stopped. */
L3_EXPORT int l3_session_step(l3_session* session, int* more);
/* *evaluated = 0 without validation data. */
L3_EXPORT int l3_session_evaluate(l3_session* session, l3_eval_metrics* metrics, int* evaluated);
L3_EXPORT int l3_session_checkpoint(l3_session* session, l3_checkpoint_info* info);
/* Not collective: one rank asking is enough; safe from another thread or a signal handler. */
L3_EXPORT void l3_session_request_checkpoint(l3_session* session);
L3_EXPORT void l3_session_request_stop(l3_session* session);
/* Called on every rank with the global values; set before running. */
L3_EXPORT int l3_session_on_step(l3_session* session, l3_step_callback callback, void* user);
L3_EXPORT int l3_session_on_eval(l3_session* session, l3_eval_callback callback, void* user);
L3_EXPORT int l3_session_on_checkpoint(l3_session* session, l3_checkpoint_callback callback,
                                       void* user);
L3_EXPORT int64_t l3_session_steps_done(const l3_session* session);
L3_EXPORT int64_t l3_session_total_steps(const l3_session* session);

#ifdef __cplusplus
}
#endif

/* NOLINTEND */
#endif /* L3_L3_H */
