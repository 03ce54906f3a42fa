/* tboard.h - TensorBoard event files, written by loom itself (no Python,
 * no TensorFlow at run time).
 *
 * The file DIR/events.out.tfevents.<seconds>.<host>.<pid>.loom is a sequence
 * of records, each: the payload length (uint64, little-endian), the masked
 * CRC-32C of those 8 bytes (uint32), the payload, the masked CRC-32C of the
 * payload (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8). Each payload is
 * an Event protocol buffer: wall_time (field 1, double), step (2, int64) and
 * either file_version "brain.Event:2" (3, the first record) or a Summary
 * (5) whose repeated Value (1) holds a tag (1, string) and a simple_value
 * (2, float): the scalars TensorBoard plots. Local; rank 0 writes.
 */
#ifndef LOOM_TBOARD_H
#define LOOM_TBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "loom/status.h"

typedef struct loom_tboard loom_tboard;

/* Make DIR (one level, as mkdir(1); an existing directory is fine) and open
 * a new event file in it, written with its version record and flushed.
 * LOOM_ECANTCREAT naming DIR or the file. */
loom_status loom_tboard_open(const char *dir, loom_tboard **out);
/* The file's path (for messages). */
const char *loom_tboard_path(const loom_tboard *t);
/* One event of scalars at `step`: begin, add each (tag, value), end writes
 * the record and flushes it. LOOM_EOS without memory, LOOM_EIO when the
 * write fails (end). */
void loom_tboard_begin(loom_tboard *t, int64_t step);
loom_status loom_tboard_add(loom_tboard *t, const char *tag, float value);
loom_status loom_tboard_end(loom_tboard *t);
/* Every number of a JSON object as a scalar of the open event, its tag the
 * path of keys ("mem/params", "comm/dp/allreduce/bytes"; array elements by
 * index: "moe/0/tokens/3"); keys in `skip` (NULL-terminated) and non-numbers
 * are left out. The values are the JSON text's, as a reader of the JSON
 * parses them, rounded to float. LOOM_EDATA when json is not an object. */
loom_status loom_tboard_add_json(loom_tboard *t, const char *json, const char *const *skip);
/* Close (NULL: nothing); LOOM_EIO when a buffered write failed. */
loom_status loom_tboard_close(loom_tboard *t);

#endif
