// The umbrella header: everything a user needs. `namespace sc = stagecraft;` comes with it.
#pragma once

#include "config.hpp"
#include "fwd.hpp"

#include "core/allocator.hpp"
#include "core/creation.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/print.hpp"
#include "core/random.hpp"
#include "core/shape.hpp"
#include "core/tensor.hpp"
#include "io/npy.hpp"
#include "backend/cpu/thread_tuner.hpp"

#include "eager/dispatch.hpp"
#include "ops/add_n.hpp"
#include "ops/arrange.hpp"
#include "ops/binary.hpp"
#include "ops/cast.hpp"
#include "ops/clip.hpp"
#include "ops/unary.hpp"
#include "ops/where.hpp"

#include "ops/reduce.hpp"
#include "ops/scan.hpp"
#include "ops/sort.hpp"
#include "ops/clip_norm.hpp"

#include "ops/broadcast_to.hpp"
#include "ops/concat.hpp"
#include "ops/gather.hpp"
#include "ops/reshape.hpp"
#include "ops/slice.hpp"
#include "ops/transpose.hpp"

#include "ops/matmul.hpp"

#include "ops/conv.hpp"
#include "ops/pool.hpp"
#include "nn/functional.hpp"
#include "ops/stop_gradient.hpp"

#include "autodiff/custom.hpp"
#include "autodiff/gradcheck.hpp"
#include "autodiff/tape.hpp"
#include "state/checkpoint.hpp"
#include "state/safetensors.hpp"
#include "state/module.hpp"
#include "state/variable.hpp"

#include "graph/function.hpp"
#include "staged/staged.hpp"

#include "nn/activations.hpp"
#include "nn/init.hpp"
#include "nn/layers.hpp"
#include "nn/losses.hpp"
#include "optim/adam.hpp"
#include "optim/optimizer.hpp"
#include "optim/sgd.hpp"
