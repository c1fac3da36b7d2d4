// loom's common API in one include: tensors and autograd, ops, modules and
// models, optimizers and mixed precision, datasets and loaders, distributed
// data parallel, and the training loop (loom::train::Trainer). Installed as <loom/loom.h>; each header is also includable
// on its own, e.g. <loom/nn/convnet.h>.
#pragma once

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/device.h>
#include <loom/core/dtype.h>
#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/core/gradcheck.h>
#include <loom/core/log.h>
#include <loom/core/parallel.h>
#include <loom/core/tensor.h>
#include <loom/core/version.h>
#include <loom/data/cifar10.h>
#include <loom/data/dataset.h>
#include <loom/data/idx.h>
#include <loom/data/image_folder.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/data/transforms.h>
#include <loom/dist/ddp.h>
#include <loom/dist/debug_process_group.h>
#include <loom/dist/environment.h>
#include <loom/dist/metrics.h>
#include <loom/dist/process_group.h>
#include <loom/dist/store.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/convnet.h>
#include <loom/nn/efficientnet.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/nn/mobilenet.h>
#include <loom/nn/module.h>
#include <loom/nn/resnet.h>
#include <loom/nn/vgg.h>
#include <loom/ops/autocast.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/cat.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/dropout.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/layer_norm.h>
#include <loom/ops/linear.h>
#include <loom/ops/loss.h>
#include <loom/ops/pooling.h>
#include <loom/optim/amp.h>
#include <loom/optim/grad_scaler.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/master_weights.h>
#include <loom/optim/optimizer.h>
#include <loom/train/checkpoints.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>
