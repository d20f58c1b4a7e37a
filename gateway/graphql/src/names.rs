//! GraphQL names from definition names: `camelCase` fields and arguments,
//! `PascalCase` types, `SCREAMING_CASE` enum values.

/// `snake_case` or `SCREAMING_CASE` to `camelCase`.
pub fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, part) in name.split('_').filter(|p| !p.is_empty()).enumerate() {
        // A part without a lowercase letter is read as all lowercase.
        let keep = part.chars().any(|c| c.is_ascii_lowercase());
        let mut chars = part
            .chars()
            .map(|c| if keep { c } else { c.to_ascii_lowercase() });
        if let Some(first) = chars.next() {
            if i == 0 {
                out.extend(first.to_lowercase());
            } else {
                out.extend(first.to_uppercase());
            }
            out.extend(chars);
        }
    }
    out
}

/// `snake_case` to `PascalCase`.
pub fn pascal(name: &str) -> String {
    let camel = camel(name);
    let mut chars = camel.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

pub(crate) fn screaming(name: &str) -> String {
    name.to_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(camel("driver_partner_index"), "driverPartnerIndex");
        assert_eq!(camel("FARE_ADJUSTMENT"), "fareAdjustment");
        assert_eq!(camel("BASE"), "base");
        assert_eq!(camel("trips"), "trips");
        assert_eq!(pascal("trips"), "Trips");
        assert_eq!(pascal("driver_partner_index"), "DriverPartnerIndex");
        assert_eq!(camel("fareTotal"), "fareTotal");
    }
}
