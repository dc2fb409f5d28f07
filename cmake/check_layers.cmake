# The layers of zof and the arrows between them, checked on every build (`cmake -P`, run by the
# check_layers target that zof_lib depends on): a file that includes a header of a layer its own
# does not build on fails the build, naming the file, the include and the layers. One static
# library still holds the code; this check is what keeps its parts apart.
#
# A layer is source folders under src/ and the public headers (include/zof) it owns. Each may
# include its own headers and those of the layers it lists, and nothing above them:
#   util     errors, dtypes, Philox, numbers' rules, atomic files    (builds on nothing)
#   hf       Hugging Face formats: config, safetensors, tokenizer    util
#   options  finetune's options and their table                      util
#   backends the CPU and CUDA backends (backends know no model)      util
#   dist     MPI and NCCL communicators (src/comm)                   util backends
#   model    the model, its block graph, walks' weights, losses      util hf backends
#   data     tasks, batches, a run's data                            util hf options model
#   zo       the ZO and JVP walks                                    util hf backends model data
#   report   the run report                                          util options
#   runtime  the one place that picks backends                       util backends dist
#   train    the trainer, resume, replay                             all but app
#   app      what the CLI and Python share (text commands)           all
# (tools/ and python/ are the app's faces and may include anything.)
cmake_minimum_required(VERSION 3.22)
if(NOT DEFINED ZOF_SOURCE_DIR)
  message(FATAL_ERROR "check_layers.cmake: pass -DZOF_SOURCE_DIR=<the repository>")
endif()

set(dirs_util util)
set(dirs_hf hf)
set(dirs_options options)
set(dirs_backends cpu cuda)
set(dirs_dist comm)
set(dirs_model model)
set(dirs_data data)
set(dirs_zo zo)
set(dirs_report report)
set(dirs_runtime runtime)
set(dirs_train train)
set(dirs_app app)

set(headers_util error dtype philox version number_rule activation)
set(headers_hf config safetensors tokenizer input_file)
set(headers_options options)
set(headers_backends backend cuda)
set(headers_dist dist)
set(headers_model model forward generate perplexity streaming loss)
set(headers_data data)
set(headers_zo zo jvp)
set(headers_report report)
set(headers_runtime runtime)
set(headers_train trainer)
set(headers_app text)

set(uses_util)
set(uses_hf util)
set(uses_options util)
set(uses_backends util)
set(uses_dist util backends)
set(uses_model util hf backends)
set(uses_data util hf options model)
set(uses_zo util hf backends model data)
set(uses_report util options)
set(uses_runtime util backends dist)
set(uses_train util hf options backends dist model data zo report runtime)
set(uses_app util hf options backends dist model data zo report runtime train)
set(layers util hf options backends dist model data zo report runtime train app)

# The layer that owns an include ("zof/NAME.h" or "DIR/..."); empty: not zof's.
function(owner_of include out)
  set(found "")
  if(include MATCHES "^zof/([a-z_0-9]+)\\.h$")
    set(name "${CMAKE_MATCH_1}")
    foreach(l ${layers})
      if(name IN_LIST headers_${l})
        set(found ${l})
      endif()
    endforeach()
    if(found STREQUAL "")
      message(FATAL_ERROR "check_layers.cmake: include/zof/${name}.h belongs to no layer; add it to one")
    endif()
  elseif(include MATCHES "^([a-z_0-9]+)/")
    set(dir "${CMAKE_MATCH_1}")
    foreach(l ${layers})
      if(dir IN_LIST dirs_${l})
        set(found ${l})
      endif()
    endforeach()
  endif()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

set(problems "")
set(files "")
foreach(l ${layers})
  foreach(d ${dirs_${l}})
    file(GLOB f "${ZOF_SOURCE_DIR}/src/${d}/*.cpp" "${ZOF_SOURCE_DIR}/src/${d}/*.h"
         "${ZOF_SOURCE_DIR}/src/${d}/*.cu" "${ZOF_SOURCE_DIR}/src/${d}/*.cuh"
         "${ZOF_SOURCE_DIR}/src/${d}/*.inc")
    foreach(x ${f})
      list(APPEND files "${l}|${x}")
    endforeach()
  endforeach()
  foreach(h ${headers_${l}})
    list(APPEND files "${l}|${ZOF_SOURCE_DIR}/include/zof/${h}.h")
  endforeach()
endforeach()
file(GLOB public "${ZOF_SOURCE_DIR}/include/zof/*.h")
foreach(h ${public})
  get_filename_component(name "${h}" NAME_WE)
  owner_of("zof/${name}.h" ignored)  # every public header has a layer
endforeach()

foreach(entry ${files})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 layer)
  list(GET parts 1 path)
  file(STRINGS "${path}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
  foreach(line ${lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*$" "\\1" inc "${line}")
    owner_of("${inc}" target)
    if(target STREQUAL "" OR target STREQUAL layer OR target IN_LIST uses_${layer})
      continue()
    endif()
    file(RELATIVE_PATH rel "${ZOF_SOURCE_DIR}" "${path}")
    string(APPEND problems "\n  ${rel} (${layer}) includes \"${inc}\" (${target}); ${layer} builds on: ${uses_${layer}}")
  endforeach()
endforeach()

if(NOT problems STREQUAL "")
  message(FATAL_ERROR "zof's layers (cmake/check_layers.cmake): an include against the arrows:${problems}\n"
                      "Move the code to the layer it belongs to, or the declaration it needs below it.")
endif()
