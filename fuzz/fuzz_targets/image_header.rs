//! An image upload's check (`sift_parse::image::check_image`): the kind by magic number and the
//! size from the PNG, JPEG, TIFF or WebP header, read by the `image` crate's decoders from
//! untrusted bytes. No panic, no runaway memory or time; a success names a size within the
//! pixel cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sift_parse::image::{ImageLimits, check_image};

fuzz_target!(|data: &[u8]| {
    let limits = ImageLimits::default();
    if let Ok(info) = check_image(data, &limits) {
        assert!(info.width > 0 && info.height > 0);
        assert!(u64::from(info.width) * u64::from(info.height) <= limits.max_pixels);
    }
});
