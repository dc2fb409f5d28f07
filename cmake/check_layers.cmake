# The include check, run by the target zof_check_layers before any layer's library builds
# (`cmake -P`): a file that includes a header of a layer its own does not build on fails the
# build here, naming the file, the include and the layers. The layers and their arrows are
# cmake/layers.cmake, the table CMakeLists.txt builds from too.
#
# The build enforces the same arrows on its own: each layer is a static library zof_<layer>
# compiled against an include root of its own (build/layers/<layer>: symlinks to its public
# headers zof/NAME.h and its src/ folders) and the roots of the layers it builds on, and nothing
# else, so an include against the arrows also fails to compile ("zof/trainer.h: No such file"),
# and a call up the layers fails to link (tests/layers proves both). This check runs first
# because its message says which arrow the include breaks; it also finds a public header that
# belongs to no layer.
cmake_minimum_required(VERSION 3.22)
if(NOT DEFINED ZOF_SOURCE_DIR)
  message(FATAL_ERROR "check_layers.cmake: pass -DZOF_SOURCE_DIR=<the repository>")
endif()

include("${CMAKE_CURRENT_LIST_DIR}/layers.cmake")

# The layer that owns an include ("zof/NAME.h" or "DIR/..."); empty: not zof's.
function(owner_of include out)
  set(found "")
  if(include MATCHES "^zof/([a-z_0-9]+)\\.h$")
    set(name "${CMAKE_MATCH_1}")
    foreach(l ${ZOF_LAYERS})
      if(name IN_LIST ZOF_LAYER_HEADERS_${l})
        set(found ${l})
      endif()
    endforeach()
    if(found STREQUAL "")
      message(FATAL_ERROR "check_layers.cmake: include/zof/${name}.h belongs to no layer; add it to one in cmake/layers.cmake")
    endif()
  elseif(include MATCHES "^([a-z_0-9]+)/")
    set(dir "${CMAKE_MATCH_1}")
    foreach(l ${ZOF_LAYERS})
      if(dir IN_LIST ZOF_LAYER_DIRS_${l})
        set(found ${l})
      endif()
    endforeach()
  endif()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

set(problems "")
set(files "")
foreach(l ${ZOF_LAYERS})
  foreach(d ${ZOF_LAYER_DIRS_${l}})
    file(GLOB f "${ZOF_SOURCE_DIR}/src/${d}/*.cpp" "${ZOF_SOURCE_DIR}/src/${d}/*.h"
         "${ZOF_SOURCE_DIR}/src/${d}/*.cu" "${ZOF_SOURCE_DIR}/src/${d}/*.cuh"
         "${ZOF_SOURCE_DIR}/src/${d}/*.inc")
    foreach(x ${f})
      list(APPEND files "${l}|${x}")
    endforeach()
  endforeach()
  foreach(h ${ZOF_LAYER_HEADERS_${l}})
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
    if(target STREQUAL "" OR target STREQUAL layer OR target IN_LIST ZOF_LAYER_USES_${layer})
      continue()
    endif()
    file(RELATIVE_PATH rel "${ZOF_SOURCE_DIR}" "${path}")
    string(APPEND problems "\n  ${rel} (${layer}) includes \"${inc}\" (${target}); ${layer} builds on: ${ZOF_LAYER_USES_${layer}}")
  endforeach()
endforeach()

if(NOT problems STREQUAL "")
  message(FATAL_ERROR "zof's layers (cmake/layers.cmake): an include against the arrows:${problems}\n"
                      "Move the code to the layer it belongs to, or the declaration it needs below it.")
endif()
