/* log.h - leveled logging to stderr.
 *
 * Messages carry a level and, once loom_log_set_rank() has been called in an
 * MPI job, the rank that printed them. By default only rank 0 prints info;
 * warnings and errors print from every rank, because an error seen by one rank
 * only must say which rank it is.
 */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

typedef enum { LOOM_LOG_DEBUG, LOOM_LOG_INFO, LOOM_LOG_WARN, LOOM_LOG_ERROR } loom_log_level;

void loom_log_set_level(loom_log_level lvl);
/* rank < 0: not in a parallel job (no rank prefix). */
void loom_log_set_rank(int rank, int world_size);
void loom_log(loom_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define loom_debug(...) loom_log(LOOM_LOG_DEBUG, __VA_ARGS__)
#define loom_info(...) loom_log(LOOM_LOG_INFO, __VA_ARGS__)
#define loom_warn(...) loom_log(LOOM_LOG_WARN, __VA_ARGS__)
#define loom_error(...) loom_log(LOOM_LOG_ERROR, __VA_ARGS__)

#endif
