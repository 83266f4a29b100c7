"""The suites qa_run.py knows, in the order it runs them."""
from __future__ import annotations

from suites_configs import (l0_backend_config, l0_backend_onnxruntime, l0_backend_output_detail, l0_config_json,
                            l0_custom_model_config, l0_initializer_as_input, l0_libtorch_inference_mode,
                            l0_libtorch_io_names, l0_libtorch_io_types, l0_libtorch_shared_weights, l0_model_config,
                            l0_model_namespacing, l0_onnx_optimization, l0_passive_instance, l0_priority,
                            l0_storage_s3_local, l0_warmup)
from suites_decoupled import l0_client_timeout, l0_decoupled, l0_grpc_state_cleanup, l0_request_cancellation
from suites_ensembles import l0_simple_ensemble
from suites_http import l0_grpc, l0_http, l0_input_validation, l0_shared_memory
from suites_models import l0_batch_input, l0_batcher, l0_infer, l0_lifecycle
from suites_observe import (l0_cmdline_trace, l0_iterative_sequence, l0_logging, l0_metrics, l0_rate_limiter,
                            l0_response_cache, l0_response_statistics)
from suites_protocols import (l0_backend_bls, l0_data_compression, l0_http_fuzz, l0_https, l0_io, l0_json,
                              l0_large_payload, l0_output_validation, l0_pytorch_python_runtime, l0_query,
                              l0_secure_grpc)
from suites_openai import l0_openai
from suites_python_backend import l0_backend_python
from suites_queue import l0_model_queue
from suites_sequence import (l0_dyna_implicit_state, l0_dyna_sequence_batcher, l0_http_generate, l0_implicit_state,
                             l0_sequence_batcher, l0_sequence_batcher_implicit, l0_sequence_corrid_batcher)
from suites_tensors import (l0_client_nobatch, l0_infer_reshape, l0_infer_variable, l0_infer_zero, l0_nan_inf,
                            l0_nullchar_string, l0_optional_input, l0_output_name, l0_parameters, l0_scalar_io,
                            l0_server_status, l0_string_io)
from suites_trace import l0_trace
from suites_updates import l0_model_update

SUITES = {
    "L0_http": l0_http,
    "L0_input_validation": l0_input_validation,
    "L0_shared_memory": l0_shared_memory,
    "L0_infer": l0_infer,
    "L0_batcher": l0_batcher,
    "L0_batch_input": l0_batch_input,
    "L0_lifecycle": l0_lifecycle,
    "L0_http_generate": l0_http_generate,
    "L0_sequence_batcher": l0_sequence_batcher,
    "L0_sequence_batcher_implicit": l0_sequence_batcher_implicit,
    "L0_string_io": l0_string_io,
    "L0_nullchar_string": l0_nullchar_string,
    "L0_scalar_io": l0_scalar_io,
    "L0_nan_inf": l0_nan_inf,
    "L0_infer_zero": l0_infer_zero,
    "L0_infer_reshape": l0_infer_reshape,
    "L0_infer_variable": l0_infer_variable,
    "L0_optional_input": l0_optional_input,
    "L0_output_name": l0_output_name,
    "L0_client_nobatch": l0_client_nobatch,
    "L0_parameters": l0_parameters,
    "L0_server_status": l0_server_status,
    "L0_simple_ensemble": l0_simple_ensemble,
    "L0_backend_python": l0_backend_python,
    "L0_model_queue": l0_model_queue,
    "L0_decoupled": l0_decoupled,
    "L0_request_cancellation": l0_request_cancellation,
    "L0_grpc_state_cleanup": l0_grpc_state_cleanup,
    "L0_client_timeout": l0_client_timeout,
    "L0_implicit_state": l0_implicit_state,
    "L0_dyna_sequence_batcher": l0_dyna_sequence_batcher,
    "L0_dyna_implicit_state": l0_dyna_implicit_state,
    "L0_sequence_corrid_batcher": l0_sequence_corrid_batcher,
    "L0_grpc": l0_grpc,
    "L0_model_update": l0_model_update,
    "L0_metrics": l0_metrics,
    "L0_response_cache": l0_response_cache,
    "L0_response_statistics": l0_response_statistics,
    "L0_rate_limiter": l0_rate_limiter,
    "L0_iterative_sequence": l0_iterative_sequence,
    "L0_logging": l0_logging,
    "L0_cmdline_trace": l0_cmdline_trace,
    "L0_trace": l0_trace,
    "L0_model_config": l0_model_config,
    "L0_config_json": l0_config_json,
    "L0_custom_model_config": l0_custom_model_config,
    "L0_model_namespacing": l0_model_namespacing,
    "L0_backend_onnxruntime": l0_backend_onnxruntime,
    "L0_onnx_optimization": l0_onnx_optimization,
    "L0_priority": l0_priority,
    "L0_initializer_as_input": l0_initializer_as_input,
    "L0_libtorch_io_names": l0_libtorch_io_names,
    "L0_libtorch_io_types": l0_libtorch_io_types,
    "L0_libtorch_inference_mode": l0_libtorch_inference_mode,
    "L0_backend_output_detail": l0_backend_output_detail,
    "L0_passive_instance": l0_passive_instance,
    "L0_storage_S3_local": l0_storage_s3_local,
    "L0_warmup": l0_warmup,
    "L0_libtorch_shared_weights": l0_libtorch_shared_weights,
    "L0_backend_config": l0_backend_config,
    "L0_https": l0_https,
    "L0_secure_grpc": l0_secure_grpc,
    "L0_json": l0_json,
    "L0_data_compression": l0_data_compression,
    "L0_query": l0_query,
    "L0_large_payload": l0_large_payload,
    "L0_http_fuzz": l0_http_fuzz,
    "L0_io": l0_io,
    "L0_output_validation": l0_output_validation,
    "L0_backend_bls": l0_backend_bls,
    "L0_pytorch_python_runtime": l0_pytorch_python_runtime,
    "L0_openai": l0_openai,
}
