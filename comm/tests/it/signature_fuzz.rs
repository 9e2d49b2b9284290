//! The wire encoding of call signatures (what the MPI and NCCL backends exchange to detect
//! mismatched collectives) under random input: every signature round-trips, and any three
//! words decode to nothing or to a signature that encodes back to words decoding to the same
//! signature (property tests, a bounded number of cases).

use localsgd_comm::{CallSignature, CollectiveKind, ElementType, ReduceOp};
use proptest::prelude::*;

fn element() -> impl Strategy<Value = Option<ElementType>> {
    prop_oneof![
        Just(None),
        Just(Some(ElementType::F32)),
        Just(Some(ElementType::F64)),
        Just(Some(ElementType::F16)),
        Just(Some(ElementType::BF16)),
        Just(Some(ElementType::U64)),
        Just(Some(ElementType::U8)),
    ]
}

fn kind() -> impl Strategy<Value = CollectiveKind> {
    prop_oneof![
        prop_oneof![
            Just(ReduceOp::Sum),
            Just(ReduceOp::Mean),
            Just(ReduceOp::Max),
            Just(ReduceOp::Min)
        ]
        .prop_map(CollectiveKind::AllReduce),
        // Roots are ranks: below the world size, which fits in 32 bits on every backend.
        (0..=u32::MAX as usize).prop_map(|root| CollectiveKind::Broadcast { root }),
        Just(CollectiveKind::Barrier),
        Just(CollectiveKind::AllGather),
        Just(CollectiveKind::Split),
        Just(CollectiveKind::AllGatherBytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn signatures_round_trip(kind in kind(), element in element(), len in any::<usize>()) {
        let sig = CallSignature { kind, element, len };
        prop_assert_eq!(CallSignature::decode(sig.encode()), Some(sig));
    }

    #[test]
    fn random_words_decode_to_nothing_or_a_stable_signature(words in any::<[u64; 3]>()) {
        if let Some(sig) = CallSignature::decode(words) {
            prop_assert_eq!(CallSignature::decode(sig.encode()), Some(sig));
        }
    }

    #[test]
    fn kinds_and_elements_decode_only_from_their_codes(
        kind_code in any::<u32>(),
        arg in any::<u32>(),
        element_code in any::<u64>(),
    ) {
        let words = [(u64::from(kind_code) << 32) | u64::from(arg), element_code, 7];
        let known_kind = match kind_code {
            1 => arg <= 3,
            2..=6 => true,
            _ => false,
        };
        let decoded = CallSignature::decode(words);
        prop_assert_eq!(decoded.is_some(), known_kind && element_code <= 6);
    }
}
