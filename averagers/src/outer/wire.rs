//! How a pseudo-gradient travels between the ranks: in full precision, in half precision, or
//! as a lossy codec's messages with error feedback; blocking, or started on the non-blocking
//! communicator and waited for later (Streaming DiLoCo's delay).

use super::compression::{AverageCompression, LossyExchange};
use crate::error::AveragerError;
use half::{bf16, f16};
use localsgd_comm::codec::{
    CodecSpec, ErrorFeedback, QuantizedFeedback, encode_with_feedback, mean_of_messages,
    message_len, quantized_mean,
};
use localsgd_comm::params::FlatBuffer;
use localsgd_comm::precision::Compressible;
use localsgd_comm::{
    AsyncGroup, Element, Group, GroupExt, Pending, Precision, average_compressed, round_to,
};

/// A fragment's averaged pseudo-gradient on its way (Streaming DiLoCo with a delay), or
/// arrived.
pub(super) enum Transfer {
    F32(Pending<f32>),
    F64(Pending<f64>),
    /// In half precision on the wire; `wide`: the parameters are f64.
    F16(Pending<f16>, bool),
    Bf16(Pending<bf16>, bool),
    /// Every rank's lossy message, gathered: decoded and averaged when it arrives (`n`
    /// values, `world` ranks).
    Gathered {
        pending: Pending<u8>,
        spec: CodecSpec,
        n: usize,
        world: usize,
    },
    Ready(FlatBuffer),
}

impl Transfer {
    pub(super) fn into_ready(self) -> Result<FlatBuffer, AveragerError> {
        fn widen<H: Element>(v: Vec<H>, wide: bool) -> FlatBuffer {
            if wide {
                FlatBuffer::F64(v.into_iter().map(|x| x.to_f64()).collect())
            } else {
                FlatBuffer::F32(v.into_iter().map(|x| x.to_f64() as f32).collect())
            }
        }
        Ok(match self {
            Transfer::F32(p) => FlatBuffer::F32(p.wait()?),
            Transfer::F64(p) => FlatBuffer::F64(p.wait()?),
            Transfer::F16(p, wide) => widen(p.wait()?, wide),
            Transfer::Bf16(p, wide) => widen(p.wait()?, wide),
            Transfer::Gathered {
                pending,
                spec,
                n,
                world,
            } => {
                let gathered = pending.wait()?;
                let mut mean = vec![0.0f32; n];
                mean_of_messages(&spec, &gathered, world, n, &mut mean)?;
                FlatBuffer::F32(mean)
            }
            Transfer::Ready(b) => b,
        })
    }
}

/// The non-blocking communicator over `world`, created (collectively) on first use.
pub(super) fn side_group<'a>(
    side: &'a mut Option<AsyncGroup>,
    world: &Group,
) -> Result<&'a mut AsyncGroup, AveragerError> {
    if side.is_none() {
        *side = Some(AsyncGroup::new(world.clone())?);
    }
    side.as_mut()
        .ok_or_else(|| AveragerError::Outer("no communicator".into()))
}

/// A parameter element type whose averages travel as a [`Transfer`].
pub(super) trait Wire: Element + Compressible {
    /// The transfer of a full-precision average.
    fn transfer(pending: Pending<Self>) -> Transfer;
    /// These values as a flat buffer.
    fn flat(values: Vec<Self>) -> FlatBuffer;
    /// Whether this is f64 (a half-precision transfer widens back to it).
    const WIDE: bool;
    /// These values as f32 (what the lossy codecs encode); `None` for f64.
    fn as_f32(v: &[Self]) -> Option<&[f32]>;
    /// The same, to write.
    fn as_f32_mut(v: &mut [Self]) -> Option<&mut [f32]>;
}

impl Wire for f32 {
    fn transfer(pending: Pending<Self>) -> Transfer {
        Transfer::F32(pending)
    }
    fn flat(values: Vec<Self>) -> FlatBuffer {
        FlatBuffer::F32(values)
    }
    const WIDE: bool = false;
    fn as_f32(v: &[Self]) -> Option<&[f32]> {
        Some(v)
    }
    fn as_f32_mut(v: &mut [Self]) -> Option<&mut [f32]> {
        Some(v)
    }
}

impl Wire for f64 {
    fn transfer(pending: Pending<Self>) -> Transfer {
        Transfer::F64(pending)
    }
    fn flat(values: Vec<Self>) -> FlatBuffer {
        FlatBuffer::F64(values)
    }
    const WIDE: bool = true;
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

/// How one sync's pseudo-gradient travels: the averager's compression, and for a lossy codec
/// the fragment's error feedback and the round (the outer-step count, which keys stochastic
/// rounding).
pub(super) struct Lossy<'a> {
    compression: Option<AverageCompression>,
    feedback: Option<&'a mut ErrorFeedback>,
    /// The owner's residual of the quantized all-reduce.
    owned: Option<&'a mut ErrorFeedback>,
    round: u64,
}

impl<'a> Lossy<'a> {
    pub(super) fn new(
        compression: Option<AverageCompression>,
        feedback: Option<&'a mut ErrorFeedback>,
        owned: Option<&'a mut ErrorFeedback>,
        round: u64,
    ) -> Self {
        Self {
            compression,
            feedback,
            owned,
            round,
        }
    }

    /// Full precision.
    pub(super) fn none() -> Self {
        Self::new(None, None, None, 0)
    }

    /// This rank's message for `d`: `d` plus the residual, encoded (the residual updated).
    fn encode<T: Wire>(
        &mut self,
        spec: &CodecSpec,
        d: &[T],
        rank: usize,
    ) -> Result<Vec<u8>, AveragerError> {
        let d = T::as_f32(d).ok_or_else(|| f64_refused(spec))?;
        let mut msg = Vec::with_capacity(message_len(spec, d.len()));
        encode_with_feedback(
            spec,
            self.feedback.as_deref_mut(),
            d,
            self.round,
            rank,
            &mut msg,
        )?;
        Ok(msg)
    }
}

/// The fragment's error feedback for a sync of `n` values (created at the first one), when
/// `compression` is a lossy codec with error feedback.
pub(super) fn feedback_of(
    slot: &mut Option<ErrorFeedback>,
    compression: Option<AverageCompression>,
    n: usize,
) -> Option<&mut ErrorFeedback> {
    match compression {
        Some(AverageCompression::Lossy {
            error_feedback: true,
            ..
        }) => Some(slot.get_or_insert_with(|| ErrorFeedback::new(n))),
        _ => None,
    }
}

/// The fragment's owner residual for the quantized all-reduce (created at its first use), when
/// `compression` is a lossy codec with error feedback whose exchange for `n` values on `world`
/// ranks is the all-reduce.
pub(super) fn owned_of(
    slot: &mut Option<ErrorFeedback>,
    compression: Option<AverageCompression>,
    n: usize,
    world: usize,
) -> Option<&mut ErrorFeedback> {
    match compression {
        Some(AverageCompression::Lossy {
            spec,
            error_feedback: true,
            exchange,
        }) if exchange.resolve(&spec, n, world) == LossyExchange::AllReduce => {
            Some(slot.get_or_insert_with(|| ErrorFeedback::new(n)))
        }
        _ => None,
    }
}

/// The world's mean of the pseudo-gradient `d`: started on `side` (non-blocking) when given,
/// else computed now.
pub(super) fn mean_delta<T: Wire>(
    mut d: Vec<T>,
    side: Option<&mut AsyncGroup>,
    world: &Group,
    codec: Lossy<'_>,
) -> Result<Transfer, AveragerError> {
    match side {
        Some(side) => start_transfer(side, d, world, codec),
        None => {
            group_mean(world, &mut d, codec)?;
            Ok(Transfer::Ready(T::flat(d)))
        }
    }
}

/// Start averaging `d` on `side` (in half precision: rounded once, divided and summed there,
/// as [`group_mean`]; a lossy codec: this rank's message encoded now, every rank's gathered).
pub(super) fn start_transfer<T: Wire>(
    side: &mut AsyncGroup,
    d: Vec<T>,
    world: &Group,
    mut codec: Lossy<'_>,
) -> Result<Transfer, AveragerError> {
    Ok(match codec.compression {
        Some(AverageCompression::Half(Precision::Fp16)) => Transfer::F16(
            side.start_average(d.iter().map(|&x| x.to_f16()).collect())?,
            T::WIDE,
        ),
        Some(AverageCompression::Half(Precision::Bf16)) => Transfer::Bf16(
            side.start_average(d.iter().map(|&x| x.to_bf16()).collect())?,
            T::WIDE,
        ),
        Some(AverageCompression::Lossy { spec, exchange, .. }) => {
            if exchange == LossyExchange::AllReduce && world.size() > 1 {
                return Err(AveragerError::Outer(
                    "`average-exchange` = all-reduce runs blocking, and this exchange is \
                     delayed (Streaming DiLoCo's `delay`): use `auto` or `all-gather` (a delayed \
                     exchange is an all-gather), or delay 0"
                        .into(),
                ));
            }
            let msg = codec.encode(&spec, &d, world.rank())?;
            Transfer::Gathered {
                pending: side.start_all_gather_bytes(msg)?,
                spec,
                n: d.len(),
                world: world.size(),
            }
        }
        None => T::transfer(side.start_average(d)?),
    })
}

/// `v` replaced by its mean over `world` (divide, then sum), on the wire as `codec` says. One
/// rank sends nothing (the mean of one replica is itself); compression still rounds there, as
/// the wire would.
pub(super) fn group_mean<T: Wire>(
    world: &Group,
    v: &mut [T],
    mut codec: Lossy<'_>,
) -> Result<(), AveragerError> {
    match (codec.compression, world.size()) {
        (None, 1) => {}
        (None, _) => world.average_slice(v)?,
        (Some(AverageCompression::Half(p)), 1) => round_to(v, p),
        (Some(AverageCompression::Half(p)), _) => average_compressed(&**world, v, p)?,
        (Some(AverageCompression::Lossy { spec, exchange, .. }), size)
            if exchange.resolve(&spec, v.len(), size) == LossyExchange::AllReduce =>
        {
            let x = T::as_f32(v).ok_or_else(|| f64_refused(&spec))?.to_vec();
            let out = T::as_f32_mut(v).ok_or_else(type_changed)?;
            let feedback = match (codec.feedback, codec.owned) {
                (Some(sent), Some(owned)) => Some(QuantizedFeedback { sent, owned }),
                _ => None,
            };
            quantized_mean(&**world, &spec, &x, feedback, codec.round, out)?;
        }
        (Some(AverageCompression::Lossy { spec, .. }), size) => {
            let msg = codec.encode(&spec, v, world.rank())?;
            let gathered = if size == 1 {
                msg
            } else {
                let mut all = vec![0u8; msg.len() * size];
                world.all_gather_bytes(&msg, &mut all)?;
                all
            };
            let out = T::as_f32_mut(v).ok_or_else(type_changed)?;
            mean_of_messages(&spec, &gathered, size, out.len(), out)?;
        }
    }
    Ok(())
}

fn f64_refused(spec: &CodecSpec) -> AveragerError {
    AveragerError::Outer(format!(
        "{} compression encodes f32 pseudo-gradients; these parameters are f64 (valid: fp16, \
         bf16 or none for f64 parameters)",
        spec.codec
    ))
}

pub(super) fn type_changed() -> AveragerError {
    AveragerError::Outer("θ and the outer optimizer's state disagree in element type".into())
}
