# The C++ of worker/proto/shard.proto as a static library, generated at build time: one recipe for the
# worker (with the gRPC service, GRPC) and the fuzz targets (messages only, worker/fuzz). Needs
# DGR_PROTOC (and DGR_GRPC_CPP_PLUGIN with GRPC); the caller links the library to protobuf (and gRPC).
function(dgr_proto_library name)
    cmake_parse_arguments(ARG "GRPC" "" "" ${ARGN})
    set(proto_dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../proto)
    set(gen_dir ${CMAKE_CURRENT_BINARY_DIR}/gen)
    file(MAKE_DIRECTORY ${gen_dir})
    set(outputs ${gen_dir}/shard.pb.cc ${gen_dir}/shard.pb.h)
    set(args --proto_path=${proto_dir} --cpp_out=${gen_dir})
    if (ARG_GRPC)
        list(APPEND outputs ${gen_dir}/shard.grpc.pb.cc ${gen_dir}/shard.grpc.pb.h)
        list(APPEND args --grpc_out=${gen_dir} --plugin=protoc-gen-grpc=${DGR_GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
        OUTPUT ${outputs}
        COMMAND ${DGR_PROTOC} ${args} ${proto_dir}/shard.proto
        DEPENDS ${proto_dir}/shard.proto
        COMMENT "dgr: generating C++ from shard.proto"
        VERBATIM)
    add_library(${name} STATIC ${outputs})
    target_include_directories(${name} PUBLIC ${gen_dir})
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
