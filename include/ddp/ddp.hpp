// The umbrella header: #include <ddp/ddp.hpp> gives the whole library that this build has.
// SPDX-License-Identifier: MIT
//
// Optional parts (CUDA kernels, NCCL, MPI) appear only when the including target links ddp::cuda,
// ddp::nccl or ddp::mpi, which define DDP_WITH_*; CUDA kernels (.cuh) only when nvcc compiles the
// file.
#pragma once

// defines: DDP_VERSION_*, version_string()
#include "ddp/version.hpp"
// defines: DDP_HOST_DEVICE, DDP_WITH_*, BuildConfig
#include "ddp/config.hpp"
// defines: Error, ConfigError, ValueError, IoError, StoreError, CommError, TimeoutError, CudaError
#include "ddp/core/error.hpp"
// defines: DDP_CHECK, DDP_CHECK_EQ/NE/LT/LE/GT/GE, DDP_CHECK_AS
#include "ddp/core/check.hpp"
// defines: log::Level, log::init, log::set_rank, DDP_LOG_INFO/WARN/...
#include "ddp/core/log.hpp"
// defines: detail::str, detail::join
#include "ddp/core/str.hpp"
// defines: Clock (steady_clock: every timeout, deadline, step time and trace span)
#include "ddp/core/clock.hpp"
// defines: crc32c, crc32c_update, masked_crc32c (TFRecord framing)
#include "ddp/core/crc32c.hpp"
// defines: trace::Recorder, trace::Activation, trace::Span, trace::Event (spans of a step,
// train/trace.hpp writes them)
#include "ddp/core/trace.hpp"
// defines: net::listen/accept/connect with deadlines, net::read_exact/write_all, net::SocketError
// (sockets)
#include "ddp/core/net.hpp"
// defines: store::Store, store::Bytes
#include "ddp/store/store.hpp"
// defines: store::HashStore
#include "ddp/store/hash_store.hpp"
// defines: store::wire::parse_request/encode_request (PyTorch TCPStore protocol, 1.x and 2.x)
#include "ddp/store/wire.hpp"
// defines: store::listen_tcp, connect_tcp, read_exact, write_all (the store's words over
// core/net.hpp)
#include "ddp/store/socket.hpp"
// defines: store::TcpStoreServer, store::TcpStoreServerOptions
#include "ddp/store/tcp_store_server.hpp"
// defines: store::TcpStore, store::TcpStoreOptions, store::TcpProtocol
#include "ddp/store/tcp_store.hpp"
// defines: store::PrefixStore
#include "ddp/store/prefix_store.hpp"
// defines: store::FileStore
#include "ddp/store/file_store.hpp"
// defines: store::make_store, store::RendezvousOptions
#include "ddp/store/rendezvous.hpp"

// ---- env: which launcher started this process ----
// defines: env::Env
#include "ddp/env/env.hpp"
// defines: env::LaunchInfo
#include "ddp/env/launch_info.hpp"
// defines: env::LauncherPolicy, env::VarNames, env::validate
#include "ddp/env/policy.hpp"
// defines: env::expand_hostlist, env::expand_tasks_per_node
#include "ddp/env/hostlist.hpp"
// defines: env::Torchrun, env::EnvUrl, env::OpenMpi, env::Pmi, env::Mvapich, env::Slurm
#include "ddp/env/env_url.hpp"
#include "ddp/env/mvapich.hpp"
#include "ddp/env/openmpi.hpp"
#include "ddp/env/pmi.hpp"
#include "ddp/env/slurm.hpp"
#include "ddp/env/torchrun.hpp"
// defines: env::LaunchFlags, env::extract_launch_flags
#include "ddp/env/flags.hpp"
// defines: env::describe, env::log_launch, env::to_json, env::launch_info_from_json
#include "ddp/env/describe.hpp"
// defines: env::DetectOptions, env::detect, env::detect_launch
#include "ddp/env/detect.hpp"

// ---- tensor: devices, shapes, owning tensors and views, copies, random numbers ----
// defines: Cpu, Cuda, Device, Exec<D>
#include "ddp/tensor/device.hpp"
// defines: Shape
#include "ddp/tensor/shape.hpp"
// defines: Allocator<D>, Storage<D>, MemoryStats, cpu_memory_stats, reset_peak_cpu_memory,
// release_cached_cpu_memory
#include "ddp/tensor/storage.hpp"
// defines: TensorView<T, D>, expect_shape
#include "ddp/tensor/view.hpp"
// defines: Tensor<T, D>
#include "ddp/tensor/tensor.hpp"
// defines: copy, convert, to<D>
#include "ddp/tensor/copy.hpp"
// defines: Generator (Philox4x32-10), RngState, manual_seed, initial_seed (the default generator
// layers draw from)
#include "ddp/tensor/random.hpp"
// defines: Prefetcher<Cpu, T...>, PrefetchRing, PrefetchFeed, prefetch_feed (batches onto the
// device one step ahead)
#include "ddp/tensor/prefetch.hpp"

// ---- kernels: CPU reference kernels (CUDA kernels: kernels/cuda/kernels.cuh, under nvcc) ----
// defines: kernels::*Args, conv2d_output_shape, maxpool2d_output_shape
#include "ddp/kernels/args.hpp"
// defines: kernels::LayerNorm*Args, Embedding*Args, Dropout*Args (the transformer modules' kernels)
#include "ddp/kernels/dropout_args.hpp"
#include "ddp/kernels/embedding_args.hpp"
#include "ddp/kernels/layer_norm_args.hpp"
// defines: elementwise functors (ReluForward, Add, Axpy, SgdStep, ...)
#include "ddp/kernels/elementwise.hpp"
// defines: kernels::ConvGeometry, kernels::PoolGeometry (shared by the CPU and CUDA kernels)
#include "ddp/kernels/geometry.hpp"
// defines: Kernels<D> (primary), kernels::ElementwiseKernels<D>
#include "ddp/kernels/kernels.hpp"
// defines: Kernels<Cpu>, kernels::cpu::ThreadPool, kernels::cpu::gemm
#include "ddp/kernels/cpu/kernels.hpp"
// defines: kernels::conv_*_map (conv2d's implicit-GEMM operand maps), kernels::BnMoments,
//          kernels::BnGeometry (BatchNorm statistics), kernels::OpTimeline, kernels::OpProfile
//          (per-op-class GPU time, host side)
#include "ddp/kernels/bn_stats.hpp"
#include "ddp/kernels/conv_gemm_maps.hpp"
#include "ddp/kernels/op_profile.hpp"
// defines: kernels::StridedIndex, kernels::BroadcastBinary, kernels::ReduceSum, ... (broadcasting
//          element-wise functors of the autograd ops, both devices)
#include "ddp/kernels/broadcast.hpp"

// ---- autograd: reverse-mode autodiff for models written with ops (docs/decisions/0071) ----
// defines: autograd::Var, autograd::NoGradGuard, autograd::GradSink and the ops (matmul, linear,
// softmax, ...)
#include "ddp/autograd/autograd.hpp"

// ---- CUDA runtime and kernels: only when nvcc compiles the including file (link ddp::cuda) ----
#if DDP_CUDA_COMPILER
// defines: DDP_CUDA_CHECK, DDP_CUDA_CHECK_NOTHROW, DDP_CUBLAS_CHECK
#  include "ddp/core/cuda_check.hpp"
// defines: Allocator<Cuda>, CudaMemoryStats, cuda_memory_stats, reset_peak_cuda_memory,
// release_cached_cuda_memory
#  include "ddp/tensor/cuda/allocator.hpp"
// defines: PinnedBuffer
#  include "ddp/tensor/cuda/pinned.hpp"
// defines: Stream, Event, cuda_stream, synchronize, cuda_device_count
#  include "ddp/tensor/cuda/stream.hpp"
// defines: DeviceCopy<Cuda, *>, copy(..., Exec<Cuda>)
#  include "ddp/tensor/cuda/copy.hpp"
// defines: Prefetcher<Cuda, T...>, CudaUploadBackend (pinned slots uploaded on a copy stream)
#  include "ddp/tensor/cuda/prefetcher.hpp"
// defines: Kernels<Cuda>, kernels::cuda::ConvMath
#  include "ddp/kernels/cuda/kernels.cuh"
// defines: autograd::detail::Gemm<Cuda> (the autograd ops' matrix products on cuBLAS)
#  include "ddp/autograd/cuda/gemm.cuh"
#endif

// ---- nn, optim: modules with explicit backward, ResNet, losses, SGD, AdamW ----
// defines: nn::Parameter, nn::Buffer, nn::Module, nn::Sequential
#include "ddp/nn/check_inputs.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/nn/sequential.hpp"
// defines: nn::SkipDefaultInit, nn::init_uniform, nn::init_normal, nn::fan_in_bound (layers'
// default initialisation)
#include "ddp/nn/init.hpp"
// defines: nn::Conv2d, nn::BatchNorm2d, nn::ReLU, nn::MaxPool2d, nn::AdaptiveAvgPool2d, nn::Linear
#include "ddp/nn/adaptive_avg_pool2d.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/conv2d.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/maxpool2d.hpp"
#include "ddp/nn/relu.hpp"
// defines: nn::ResidualBlock, nn::BlockOptions, nn::BasicBlock, nn::Bottleneck, nn::ResNet,
//          nn::CrossEntropyLoss, nn::MSELoss
#include "ddp/nn/basic_block.hpp"
#include "ddp/nn/bottleneck.hpp"
#include "ddp/nn/loss.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/resnet.hpp"
// defines: nn::convert_sync_batchnorm, nn::CommChannelSums (BatchNorm2d statistics over all ranks)
#include "ddp/nn/sync_batchnorm.hpp"
// defines: nn::CausalSelfAttention, nn::CausalSelfAttentionOptions (minGPT's masked multi-head
// self-attention)
#include "ddp/nn/causal_self_attention.hpp"
// defines: nn::GPT, nn::GPTOptions, nn::EmbeddingStem, nn::AttentionLayer, nn::Block (the
// tutorial's minGPT)
#include "ddp/nn/gpt.hpp"
// defines: nn::Embedding, nn::LayerNorm, nn::GELU, nn::Dropout (transformer modules)
#include "ddp/nn/dropout.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/layer_norm.hpp"
// defines: nn::Activation and its aliases nn::SiLU, nn::Tanh, nn::Sigmoid, nn::Mish,
//          nn::Identity, nn::Flatten, nn::Residual (layers that compose without backward code)
#include "ddp/nn/activation.hpp"
#include "ddp/nn/flatten.hpp"
#include "ddp/nn/identity.hpp"
#include "ddp/nn/residual_wrapper.hpp"
// defines: nn::OpsModule, nn::OpsGraph (modules whose forward is written with autograd ops,
// docs/decisions/0076)
#include "ddp/nn/ops_module.hpp"
// defines: optim::Optimizer, optim::HasParamSteps, optim::StateTensor, optim::ParamGroup,
// optim::weight_decay_groups
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/param_groups.hpp"
// defines: optim::SGD, optim::AdamW, optim::clip_grad_norm, optim::clip_to_norm, optim::GradScaler,
// optim::LrSchedule
#include "ddp/optim/adamw.hpp"
#include "ddp/optim/clip.hpp"
#include "ddp/optim/grad_scaler.hpp"
#include "ddp/optim/lr_schedule.hpp"
#include "ddp/optim/sgd.hpp"

// ---- data, train: datasets, samplers, loader, safetensors files, checkpoints ----
// defines: data::Sampler, data::DistributedSampler, data::EvalSampler, data::permutation
#include "ddp/data/distributed_sampler.hpp"
// defines: data::Dataset, data::Batch, data::make_batch
#include "ddp/data/dataset.hpp"
// defines: data::SyntheticDataset
#include "ddp/data/synthetic.hpp"
// defines: data::CifarBinaryDataset, data::cifar10_files
#include "ddp/data/cifar10.hpp"
// defines: data::DataLoader
#include "ddp/data/loader.hpp"
// defines: data::CharDataset, data::TokenBatch, data::split_indices (character-level text, the
// minGPT job)
#include "ddp/data/char_dataset.hpp"
// defines: data::ImageFolder, data::decode_image, the ImageNet transforms (decoding needs
// ddp::image)
#include "ddp/data/image_decode.hpp"
#include "ddp/data/image_folder.hpp"
#include "ddp/data/image_transform.hpp"
// defines: parallel::assign_buckets, parallel::BucketLayout
#include "ddp/parallel/bucket.hpp"
// defines: parallel::GradBucket, parallel::HookResult, parallel::CommHook,
//          parallel::allreduce_hook, parallel::fp16_compress_hook, parallel::bf16_compress_hook,
//          parallel::CommHookKind, parallel::parse_comm_hook
#include "ddp/parallel/comm_hooks.hpp"
// defines: parallel::DdpOptions, parallel::bucket_cap_bytes_from_mb, parallel::make_comm_hook
#include "ddp/parallel/ddp_options.hpp"
// defines: parallel::StepTrace, parallel::BucketTrace
#include "ddp/parallel/step_trace.hpp"
// defines: parallel::Reducer, parallel::BucketTransport
#include "ddp/parallel/reducer.hpp"
// defines: parallel::Broadcaster<Cpu>, parallel::Transport<T, Cpu>
#include "ddp/parallel/transport.hpp"
// defines: parallel::view_grads_in_buckets, parallel::own_grads (gradient_as_bucket_view)
#include "ddp/parallel/grad_views.hpp"
// defines: parallel::DistributedDataParallel
#include "ddp/parallel/ddp.hpp"
// defines: parallel::sum_over_ranks (host values summed over every rank, in place, through D's
// memory)
#include "ddp/parallel/rank_sum.hpp"
// defines: parallel::ZeroRedundancyOptimizer, parallel::optimizer_state_bytes
#include "ddp/parallel/zero.hpp"
#if DDP_CUDA_COMPILER
// defines: parallel::Broadcaster<Cuda>, parallel::Transport<T, Cuda> (DistributedDataParallel<T,
// Cuda> needs them)
#  include "ddp/parallel/cuda/transport.cuh"
#endif
// defines: train::DistFlags, train::add_dist_options, train::read_dist_flags
#include "ddp/train/options.hpp"
// defines: train::parse_args (cxxopts parsing whose errors name the flag)
#include "ddp/train/parse_args.hpp"
// defines: train::choose_device, train::DeviceRequest, train::DeviceChoice, train::cuda_device_for
#include "ddp/train/device_choice.hpp"
// defines: train::TensorBoardWriter, train::Scalar, train::tfevents (TensorBoard event files, no
// protobuf)
#include "ddp/train/tensorboard.hpp"
// defines: train::MetricsWriter, train::tensorboard_scalars, train::add_comm_metrics,
//          train::step_record, train::StepTimes
#include "ddp/train/metrics.hpp"
// defines: train::StepTracer, train::TraceOptions, train::parse_trace_steps (--trace: a Chrome
// trace of every rank)
#include "ddp/train/trace.hpp"
// defines: train::Progress (progress with an ETA, live on a terminal), train::progress_line,
//          train::live_progress_wanted, train::stdout_shared_by, train::format_eta
#include "ddp/train/progress.hpp"
// defines: train::Bookkeeper, train::StepStats, train::RunTotals, train::after_snapshot_hook (a
//          training loop's timing, progress, metrics, trace and snapshot cadence)
#include "ddp/train/bookkeeper.hpp"
// defines: train::sum_over_ranks (a few host numbers summed over every rank: evaluation metrics)
#include "ddp/train/rank_sum.hpp"
// defines: train::read_and_broadcast
#include "ddp/train/snapshot_sync.hpp"
// defines: train::copy_state, train::state_on, train::StateOn, train::on_device, train::OnDevice
#include "ddp/train/device_state.hpp"
// defines: train::write_file_atomic, train::WriteOptions
#include "ddp/train/atomic_file.hpp"
// defines: train::SafetensorsReader, train::read_safetensors, train::parse_safetensors
#include "ddp/train/safetensors.hpp"
// defines: train::SafetensorsWriter
#include "ddp/train/safetensors_writer.hpp"
// defines: train::save_state_dict, load_state_dict, save_snapshot, load_snapshot,
// serialize_snapshot
#include "ddp/train/checkpoint.hpp"
// defines: train::resume_snapshot, train::save_snapshot_on_rank0, train::prepare_snapshot_path
#include "ddp/train/snapshot_io.hpp"
// defines: train::OptimFlags, train::add_optim_options, train::read_optim_flags (the examples'
// optimizer flags)
#include "ddp/train/optim_flags.hpp"

// ---- comm: collectives behind one Communicator (tcp always; mpi with ddp::mpi; nccl with
//   ddp::nccl)
// defines: comm::Communicator, comm::Work, comm::ReduceOp, comm::CommOptions,
//          comm::TcpCommunicator, comm::make_communicator (+ comm::MpiCommunicator /
//          comm::NcclCommunicator when built with them)
#include "ddp/comm/factory.hpp"
// defines: comm::StagedCommunicator (CUDA device memory over a host backend)
#include "ddp/comm/staging/staged_communicator.hpp"

// ---- launch: ddprun's agent, supervisor and worker environment (Linux) ----
// defines: launch::LaunchOptions, launch::parse_launch_args, launch::Supervisor,
// launch::worker_env, launch::run_agent
#include "ddp/launch/agent.hpp"
// defines: train::init_process_group, train::InitFlags, train::InitOptions, train::Job (the one
// start-up call)
#include "ddp/train/init.hpp"
