//! The models crate's integration tests, one binary (`models_it`) with a module per topic, so
//! burn and the crate are linked once.

mod data_dataset;
mod data_digits;
mod data_idx;
mod data_sampler;
mod data_synthetic;
mod data_text;
mod model_gpt;
mod model_mlp;
mod pytorch;
