//! Saved structs read only from named fields: a JSON object, never an array.
//!
//! serde's derived `Deserialize` also accepts a struct as a sequence, binding values to fields by
//! position: `[1, 2]` would read as a controller config whose `drain_every` is 1 and
//! `half_life_steps` 2, every other field at its default. [`named_fields!`] refuses that for the
//! configs, control messages, maps and dumps an engine or a user writes by hand.

/// Implements `Serialize` and `Deserialize` for a struct that derives them under
/// `#[serde(remote = "Self")]` (the derived code then lives in inherent functions, hidden from the
/// docs here): serialization is the derived one; deserialization asks for a map, so a sequence is
/// an error ("invalid type: sequence, expected `$what` as an object of named fields") and a map
/// goes through the derived code (defaults, `deny_unknown_fields`, renames) unchanged.
/// `named_fields!(@de T, "...")`: the `Deserialize` half only, for a struct that derives only
/// `Deserialize`.
macro_rules! named_fields {
    ($t:ty, $what:literal) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                <$t>::serialize(self, s)
            }
        }

        named_fields!(@de $t, $what);
    };
    (@de $t:ty, $what:literal) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Fields;
                impl<'de> serde::de::Visitor<'de> for Fields {
                    type Value = $t;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str(concat!($what, " as an object of named fields"))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        map: A,
                    ) -> Result<$t, A::Error> {
                        <$t>::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    }
                }
                d.deserialize_map(Fields)
            }
        }
    };
}
