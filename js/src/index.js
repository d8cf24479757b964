// ortlearn-training: train ortlearn's training artifacts with the ordinary onnxruntime-node /
// onnxruntime-web InferenceSession. Pass the `ort` namespace to TrainingSession.create.

export { TrainingSession } from './training_session.js';
export { CheckpointState, checkpointChecksum, CHECKPOINT_DTYPES } from './checkpoint.js';
export {
  exportForInferencing, readMetadata, readGraphIO, inputNames, outputNames, isOrtFormat,
  encodeTensor, encodeValueInfo,
} from './onnx_proto.js';
export { parseSafetensors, serializeSafetensors, DTYPES } from './safetensors.js';
export {
  pyFloatRepr, pyFloatParse, pyJsonDumps, pyJsonLoads, pyJsonString, comparePyStr,
} from './pyformat.js';
