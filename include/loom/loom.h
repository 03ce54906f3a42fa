/* loom.h - the whole public API of libloom in one include.
 *
 *     #include <loom/loom.h>
 *     cc prog.c $(pkg-config --cflags --libs loom)            (libloom.so)
 *     find_package(loom) + target_link_libraries(t loom::loom) (CMake)
 *
 * Each header below documents its module (docs/architecture.md has the map):
 * the device is created once (device.h) and passed explicitly; groups of
 * ranks are communicators (comm.h); a model is a parameter table plus
 * forward/backward (model.h); loom_train_run runs a whole training
 * (train.h). kernel_list.h is not included: it is the X-macro list that
 * kernels.h and backend.h expand.
 */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#include "loom/adamw.h"
#include "loom/arena.h"
#include "loom/backend.h"
#include "loom/bf16.h"
#include "loom/calibrate.h"
#include "loom/chat_template.h"
#include "loom/ckpt.h"
#include "loom/comm.h"
#include "loom/cp.h"
#include "loom/cpu.h"
#include "loom/data.h"
#include "loom/device.h"
#include "loom/dp.h"
#include "loom/edp.h"
#include "loom/ep.h"
#include "loom/hf_dir.h"
#include "loom/infer.h"
#include "loom/kernel_types.h"
#include "loom/kernels.h"
#include "loom/layout.h"
#include "loom/log.h"
#include "loom/mesh.h"
#include "loom/model.h"
#include "loom/moe.h"
#include "loom/pipeline.h"
#include "loom/plan.h"
#include "loom/plan_calibrate.h"
#include "loom/pp_exec.h"
#include "loom/rng.h"
#include "loom/runinfo.h"
#include "loom/safetensors.h"
#include "loom/serve.h"
#include "loom/sha256.h"
#include "loom/sim.h"
#include "loom/status.h"
#include "loom/sysmem.h"
#include "loom/tboard.h"
#include "loom/tokenizer.h"
#include "loom/tp.h"
#include "loom/trace.h"
#include "loom/train.h"
#include "loom/version.h"

#endif
