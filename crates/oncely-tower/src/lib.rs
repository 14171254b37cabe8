//! oncely-tower
