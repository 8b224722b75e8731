/*
 * tensorboard.h — the --tensorboard sink: ember-train's step and epoch rows (metrics.h) as
 * TensorBoard scalars, and once per epoch, optionally, histograms of the parameters and
 * their gradients, in an events.out.tfevents.* file that TensorBoard (and PyTorch's
 * SummaryWriter readers) open.
 *
 *     metrics_sink tb;
 *     if (!tensorboard_sink_open(&tb, "runs/exp1", true, "accuracy", -1))
 *         fprintf(stderr, "%s\n", tb.err);
 *     ...  tb.step(&tb, &row); tb.epoch(&tb, &erow); tb.params(&tb, epoch, step, params);
 *     tb.close(&tb);
 *
 * The file: TFRecord records (a little-endian uint64 length, the masked CRC-32C of those 8
 * bytes, the payload, the masked CRC-32C of the payload), each payload an Event protobuf; the
 * first is the `brain.Event:2` file_version event (then, in a resumed run, SessionLog START).
 * Tags:
 *   step rows (x: the step)     train/loss, train/lr/group<i>, train/grad_norm,
 *                               train/samples_per_s, train/data_wait_s, and with --amp
 *                               train/skipped_steps, train/loss_scale
 *   epoch rows (x: the step the epoch ended at)
 *                               epoch/epoch, epoch/train_loss, epoch/train_<metric>, epoch/lr,
 *                               epoch/grad_norm, epoch/samples_per_s, epoch/data_wait_pct,
 *                               epoch/peak_memory, val/loss, val/<metric>, test/loss,
 *                               test/<metric>, and with --amp epoch/skipped_steps,
 *                               epoch/loss_scale
 *   histograms (x: the step)    weights/<parameter>, gradients/<parameter> (when .grad is set)
 * where <metric> is the sink's metric_name (accuracy or mae). A figure that is NaN (not
 * measured: no validation set, no gradient norm) is left out rather than written as NaN.
 * Records are buffered and written out at least every 10 s (on the next row, and whenever
 * the loop calls flush), at every epoch row, and at close.
 */
#ifndef EMBER_TRAINER_TENSORBOARD_H
#define EMBER_TRAINER_TENSORBOARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrics.h"

/* Fill s as the --tensorboard sink: create dir (and its parents) when missing and a new
 * events file in it (never an existing one; its name sorts after those there). histograms:
 * write params() as histograms (else params is NULL). metric_name: "accuracy" or "mae"
 * (borrowed; it must outlive the sink). resumed_at: -1 for a new run; for a run resumed
 * after step resumed_at, the file starts with a SessionLog START event at the next step, so
 * TensorBoard reads it as the continuation of the files already in dir and drops what they
 * hold from that step on (what a killed run wrote after its last checkpoint). On failure
 * returns false with the reason in s->err, naming the directory or file, and nothing left
 * open (close need not be called). The caller calls s->close exactly once otherwise. */
bool tensorboard_sink_open(metrics_sink *s, const char *dir, bool histograms,
                           const char *metric_name, int64_t resumed_at);

/* The events file an open sink writes (borrowed; valid until close). */
const char *tensorboard_sink_path(const metrics_sink *s);

/* ---- the encoding, for tests/test_tensorboard.c ------------------------------------------- */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of data, continuing from crc (0 to
 * start): the checksum TFRecord uses. */
uint32_t tb_crc32c(uint32_t crc, const void *data, size_t n);
/* TFRecord's masked form: the CRC rotated right by 15 bits plus 0xa282ead8. */
uint32_t tb_masked_crc32c(const void *data, size_t n);
/* Write data as one TFRecord record to f; false when stdio reports a failure (errno). */
bool tb_write_record(FILE *f, const void *data, size_t n);
/* The protobuf base-128 varint of v into out; returns its length (1..10). */
size_t tb_varint(uint8_t out[10], uint64_t v);

#endif /* EMBER_TRAINER_TENSORBOARD_H */
