//! What a rank called: the signature every collective carries so mismatches are caught.

use crate::buffer::ElementType;
use std::fmt;

/// Reduction applied by an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the group size (sum first, then divide).
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        })
    }
}

/// The kind of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// All-reduce with the given op.
    AllReduce(ReduceOp),
    /// Broadcast from the given group rank.
    Broadcast {
        /// Root rank within the group.
        root: usize,
    },
    /// Barrier.
    Barrier,
    /// All-gather of a small per-rank vector.
    AllGather,
    /// All-gather of equal-length byte messages (bulk data,
    /// [`ProcessGroup::all_gather_bytes`](crate::ProcessGroup::all_gather_bytes)).
    AllGatherBytes,
    /// All-to-all of equal-length byte blocks: block `j` of every rank's buffer goes to rank
    /// `j` ([`ProcessGroup::all_to_all_bytes`](crate::ProcessGroup::all_to_all_bytes)); `len`
    /// is one block.
    AllToAllBytes,
    /// Collective creation of subgroups.
    Split,
}

/// Signature of one collective call: kind, element type and length. Ranks must agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallSignature {
    /// What was called.
    pub kind: CollectiveKind,
    /// Element type of the buffer (`None` for a barrier).
    pub element: Option<ElementType>,
    /// Number of elements.
    pub len: usize,
}

impl CallSignature {
    /// Signature of an all-reduce.
    pub fn all_reduce(op: ReduceOp, element: ElementType, len: usize) -> Self {
        Self {
            kind: CollectiveKind::AllReduce(op),
            element: Some(element),
            len,
        }
    }
    /// Signature of a broadcast.
    pub fn broadcast(root: usize, element: ElementType, len: usize) -> Self {
        Self {
            kind: CollectiveKind::Broadcast { root },
            element: Some(element),
            len,
        }
    }
    /// Signature of a barrier.
    pub fn barrier() -> Self {
        Self {
            kind: CollectiveKind::Barrier,
            element: None,
            len: 0,
        }
    }
    /// Signature of an all-gather of `len` u64 per rank.
    pub fn all_gather(len: usize) -> Self {
        Self {
            kind: CollectiveKind::AllGather,
            element: Some(ElementType::U64),
            len,
        }
    }
    /// Signature of an all-gather of `len` bytes per rank.
    pub fn all_gather_bytes(len: usize) -> Self {
        Self {
            kind: CollectiveKind::AllGatherBytes,
            element: Some(ElementType::U8),
            len,
        }
    }
    /// Signature of an all-to-all of `block` bytes to each rank.
    pub fn all_to_all_bytes(block: usize) -> Self {
        Self {
            kind: CollectiveKind::AllToAllBytes,
            element: Some(ElementType::U8),
            len: block,
        }
    }
    /// Signature of a subgroup split.
    pub fn split() -> Self {
        Self {
            kind: CollectiveKind::Split,
            element: Some(ElementType::U64),
            len: 1,
        }
    }

    /// Bytes of payload this rank contributes: its buffer's length times the element size. For
    /// an all-reduce or a broadcast that is the buffer, for an all-gather this rank's own part
    /// (`len` bytes of an [`all_gather_bytes`](Self::all_gather_bytes), not the `size * len`
    /// it receives), for an all-to-all one block — what the traffic counters add up.
    pub fn payload_bytes(&self) -> u64 {
        (self.len * self.element.map_or(0, ElementType::size_bytes)) as u64
    }

    /// Bytes this rank sends, and as many it receives, when the collective runs on a group of
    /// `size` ranks with its bandwidth-optimal algorithm (0 on one rank):
    ///
    /// | collective | bytes | algorithm |
    /// |---|---|---|
    /// | all-reduce of `n` bytes | `2 (size − 1) n / size` | ring: reduce-scatter, then all-gather |
    /// | all-gather of `len` bytes per rank (also `u64` all-gathers, a split) | `(size − 1) len` | ring |
    /// | all-to-all of `len`-byte blocks | `(size − 1) len` | each block straight to its rank |
    /// | broadcast of `n` bytes | `(size − 1) n / size` | pipelined chain: every rank but the root receives the buffer once and all but the last pass it on; each rank is charged the group's mean |
    /// | barrier | 0 | |
    ///
    /// Rounded down to whole bytes. At 2 ranks an all-reduce and an all-gather move their
    /// payload ([`payload_bytes`](Self::payload_bytes)); from 4 ranks on an all-gather of
    /// compressed messages moves `size − 1` of them, which is what a compressed average costs.
    ///
    /// ```
    /// use localsgd_comm::{CallSignature, ReduceOp};
    /// use localsgd_comm::buffer::ElementType;
    /// // An fp16 all-reduce of 1000 values on 8 ranks: 2 · 7/8 · 2000 bytes.
    /// let fp16 = CallSignature::all_reduce(ReduceOp::Mean, ElementType::F16, 1000);
    /// assert_eq!(fp16.wire_bytes(8), 3500);
    /// assert_eq!(fp16.wire_bytes(2), fp16.payload_bytes());
    /// // An int8 message of 1000 bytes all-gathered on 8 ranks: 7 messages each way.
    /// assert_eq!(CallSignature::all_gather_bytes(1000).wire_bytes(8), 7000);
    /// ```
    pub fn wire_bytes(&self, size: usize) -> u64 {
        let (n, w) = (self.payload_bytes(), size.max(1) as u64);
        match self.kind {
            CollectiveKind::AllReduce(_) => 2 * (w - 1) * n / w,
            CollectiveKind::AllGather
            | CollectiveKind::AllGatherBytes
            | CollectiveKind::AllToAllBytes
            | CollectiveKind::Split => (w - 1) * n,
            CollectiveKind::Broadcast { .. } => (w - 1) * n / w,
            CollectiveKind::Barrier => 0,
        }
    }

    /// Pack into three words (for backends that exchange signatures over the wire).
    pub fn encode(&self) -> [u64; 3] {
        let (kind, arg) = match self.kind {
            CollectiveKind::AllReduce(op) => (
                1,
                match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Mean => 1,
                    ReduceOp::Max => 2,
                    ReduceOp::Min => 3,
                },
            ),
            CollectiveKind::Broadcast { root } => (2, root as u64),
            CollectiveKind::Barrier => (3, 0),
            CollectiveKind::AllGather => (4, 0),
            CollectiveKind::Split => (5, 0),
            CollectiveKind::AllGatherBytes => (6, 0),
            CollectiveKind::AllToAllBytes => (7, 0),
        };
        let element = match self.element {
            None => 0,
            Some(ElementType::F32) => 1,
            Some(ElementType::F64) => 2,
            Some(ElementType::F16) => 3,
            Some(ElementType::BF16) => 4,
            Some(ElementType::U64) => 5,
            Some(ElementType::U8) => 6,
        };
        [kind << 32 | arg, element, self.len as u64]
    }

    /// Inverse of [`CallSignature::encode`]; `None` for words no signature encodes to.
    pub fn decode(words: [u64; 3]) -> Option<Self> {
        let arg = words[0] & 0xffff_ffff;
        let kind = match words[0] >> 32 {
            1 => CollectiveKind::AllReduce(match arg {
                0 => ReduceOp::Sum,
                1 => ReduceOp::Mean,
                2 => ReduceOp::Max,
                3 => ReduceOp::Min,
                _ => return None,
            }),
            2 => CollectiveKind::Broadcast { root: arg as usize },
            3 => CollectiveKind::Barrier,
            4 => CollectiveKind::AllGather,
            5 => CollectiveKind::Split,
            6 => CollectiveKind::AllGatherBytes,
            7 => CollectiveKind::AllToAllBytes,
            _ => return None,
        };
        let element = match words[1] {
            0 => None,
            1 => Some(ElementType::F32),
            2 => Some(ElementType::F64),
            3 => Some(ElementType::F16),
            4 => Some(ElementType::BF16),
            5 => Some(ElementType::U64),
            6 => Some(ElementType::U8),
            _ => return None,
        };
        Some(Self {
            kind,
            element,
            len: words[2] as usize,
        })
    }
}

impl fmt::Display for CallSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let element = self.element.map(|e| e.to_string()).unwrap_or_default();
        match self.kind {
            CollectiveKind::AllReduce(op) => {
                write!(f, "all_reduce({op}, {element} x {})", self.len)
            }
            CollectiveKind::Broadcast { root } => {
                write!(f, "broadcast(root {root}, {element} x {})", self.len)
            }
            CollectiveKind::Barrier => f.write_str("barrier()"),
            CollectiveKind::AllGather => write!(f, "all_gather(u64 x {})", self.len),
            CollectiveKind::AllGatherBytes => write!(f, "all_gather_bytes(u8 x {})", self.len),
            CollectiveKind::AllToAllBytes => write!(f, "all_to_all_bytes(u8 x {})", self.len),
            CollectiveKind::Split => f.write_str("new_subgroups/split()"),
        }
    }
}
