//! GraphQL names from definition names: `camelCase` fields and arguments,
//! `PascalCase` types, `SCREAMING_CASE` enum values.

/// `snake_case` or `SCREAMING_CASE` to `camelCase`.
pub fn camel(name: &str) -> String {
    let mut out = String::new();
    for (i, part) in name.split('_').filter(|p| !p.is_empty()).enumerate() {
        let lower = if part.chars().any(|c| c.is_ascii_lowercase()) {
            part.to_string()
        } else {
            part.to_ascii_lowercase()
        };
        if i == 0 {
            let mut chars = lower.chars();
            if let Some(first) = chars.next() {
                out.extend(first.to_lowercase());
                out.push_str(chars.as_str());
            }
        } else {
            let mut chars = lower.chars();
            if let Some(first) = chars.next() {
                out.extend(first.to_uppercase());
                out.push_str(chars.as_str());
            }
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
