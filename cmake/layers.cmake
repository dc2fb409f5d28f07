# zof's layers and the arrows between them: the one table that the build (CMakeLists.txt: a
# static library zof_<layer> per layer, its include root and its links) and the include check
# (cmake/check_layers.cmake) both read.
#
# A layer is source folders under src/ and the public headers (include/zof/NAME.h) it owns. It
# builds on the layers it lists, and on nothing above them:
#   util      errors, dtypes, z's key, numbers' rules, files  (nothing)
#   hf        Hugging Face config, safetensors, tokenizer      util
#   options   finetune's options and their table               util
#   backends  the CPU and CUDA backends (they know no model)   util
#   comm      MPI and NCCL communicators (src/comm)            util backends
#   model     the model, its block graph, weights, losses      util hf backends
#   data      tasks, batches, a run's data                     util hf options backends model
#   zo        the ZO and JVP walks                             util hf options backends model data
#   report    the run report                                   util options
#   runtime   the one place that picks backends                util backends comm
#   train     the trainer, resume, replay                      all but app
#   app       what the CLI and Python share (text commands)    all
# (tools/ and python/ are the app's faces and may include any public header; tests/, bench/ and
# fuzz/ may include anything.) Each list is written out whole: a layer sees the layers below
# the ones it names too, since their headers include those (data's zof/forward.h includes
# zof/backend.h); the loop at the end checks that no list leaves one out.
set(ZOF_LAYERS util hf options backends comm model data zo report runtime train app)

set(ZOF_LAYER_DIRS_util util)
set(ZOF_LAYER_DIRS_hf hf)
set(ZOF_LAYER_DIRS_options options)
set(ZOF_LAYER_DIRS_backends cpu cuda)
set(ZOF_LAYER_DIRS_comm comm)
set(ZOF_LAYER_DIRS_model model)
set(ZOF_LAYER_DIRS_data data)
set(ZOF_LAYER_DIRS_zo zo)
set(ZOF_LAYER_DIRS_report report)
set(ZOF_LAYER_DIRS_runtime runtime)
set(ZOF_LAYER_DIRS_train train)
set(ZOF_LAYER_DIRS_app app)

set(ZOF_LAYER_HEADERS_util error dtype zkey version number_rule activation choices)
set(ZOF_LAYER_HEADERS_hf config tokenizer input_file)
set(ZOF_LAYER_HEADERS_options options)
set(ZOF_LAYER_HEADERS_backends backend)
set(ZOF_LAYER_HEADERS_comm dist)
set(ZOF_LAYER_HEADERS_model model forward generate perplexity streaming loss tensor_parallel disk_tier)
set(ZOF_LAYER_HEADERS_data data)
set(ZOF_LAYER_HEADERS_zo zo)
set(ZOF_LAYER_HEADERS_report report)
set(ZOF_LAYER_HEADERS_runtime runtime)
set(ZOF_LAYER_HEADERS_train trainer)
set(ZOF_LAYER_HEADERS_app text)

set(ZOF_LAYER_USES_util)
set(ZOF_LAYER_USES_hf util)
set(ZOF_LAYER_USES_options util)
set(ZOF_LAYER_USES_backends util)
set(ZOF_LAYER_USES_comm util backends)
set(ZOF_LAYER_USES_model util hf backends)
set(ZOF_LAYER_USES_data util hf options backends model)
set(ZOF_LAYER_USES_zo util hf options backends model data)
set(ZOF_LAYER_USES_report util options)
set(ZOF_LAYER_USES_runtime util backends comm)
set(ZOF_LAYER_USES_train util hf options backends comm model data zo report runtime)
set(ZOF_LAYER_USES_app util hf options backends comm model data zo report runtime train)

# The table's own rules: ZOF_LAYERS runs bottom-up, so a layer names only layers before it (no
# cycle), and names every layer that those name.
foreach(_l ${ZOF_LAYERS})
  list(FIND ZOF_LAYERS ${_l} _il)
  foreach(_u ${ZOF_LAYER_USES_${_l}})
    list(FIND ZOF_LAYERS ${_u} _iu)
    if(_iu LESS 0 OR _iu GREATER_EQUAL _il)
      message(FATAL_ERROR "cmake/layers.cmake: ${_l} builds on ${_u}, which is not a layer below it in ZOF_LAYERS")
    endif()
    foreach(_v ${ZOF_LAYER_USES_${_u}})
      if(NOT _v IN_LIST ZOF_LAYER_USES_${_l})
        message(FATAL_ERROR "cmake/layers.cmake: ${_l} builds on ${_u}, which builds on ${_v}: add ${_v} to ZOF_LAYER_USES_${_l}")
      endif()
    endforeach()
  endforeach()
endforeach()
