//! Image uploads (PNG, JPEG, TIFF, WebP): checked here, read by OCR elsewhere.
//!
//! An image has no text to extract: its text comes from an OCR engine behind HTTP or a CLI
//! (`sift_models::ocr`), which the ingestion pipeline calls. This module decides, from the
//! bytes alone, whether an upload is an image we take: its kind by magic number (an extension
//! that lies is `content_mismatch`), its size from the header only (no pixel is decoded), and
//! at most [`ImageLimits::max_pixels`] pixels (`image_too_large`: a 30,000 × 30,000 image
//! would take gigabytes to decode and minutes to recognise).

use std::io::Cursor;

use image::{ImageFormat, ImageReader};

use crate::parse::ParseError;

/// What an image upload may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageLimits {
    /// Most pixels (width × height).
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// 100 megapixels: a scanned A4 page at 600 dpi is 35.
    fn default() -> Self {
        ImageLimits {
            max_pixels: 100_000_000,
        }
    }
}

/// An image upload that passed [`check_image`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// Its media type: `image/png`, `image/jpeg`, `image/tiff` or `image/webp`.
    pub media_type: &'static str,
    pub width: u32,
    pub height: u32,
}

/// The media type of an image we take, by magic number.
pub fn sniff_image(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
        Some("image/tiff")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// Checks an image upload: one of the kinds we take, a readable header, within `limits`.
pub fn check_image(bytes: &[u8], limits: &ImageLimits) -> Result<ImageInfo, ParseError> {
    if bytes.is_empty() {
        return Err(ParseError::Empty);
    }
    let Some(media_type) = sniff_image(bytes) else {
        return Err(ParseError::ContentMismatch {
            named: "an image (PNG, JPEG, TIFF or WebP)".into(),
            actual: "something else".into(),
        });
    };
    let format = match media_type {
        "image/png" => ImageFormat::Png,
        "image/jpeg" => ImageFormat::Jpeg,
        "image/tiff" => ImageFormat::Tiff,
        _ => ImageFormat::WebP,
    };
    let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(|error| ParseError::InvalidImage(crate::pdf::reason(&error.to_string())))?;
    if width == 0 || height == 0 {
        return Err(ParseError::InvalidImage("it has no pixels".into()));
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(ParseError::ImageTooLarge(format!(
            "{width} × {height} pixels; the limit is {} megapixels",
            limits.max_pixels / 1_000_000
        )));
    }
    Ok(ImageInfo {
        media_type,
        width,
        height,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG of `width` × `height` without pixels: enough for its dimensions.
    fn png_header(width: u32, height: u32) -> Vec<u8> {
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend_from_slice(&width.to_be_bytes());
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // 8-bit grey, deflate, no filter, no interlace
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend_from_slice(&13u32.to_be_bytes());
        png.extend_from_slice(&ihdr);
        png.extend_from_slice(&crc32fast::hash(&ihdr).to_be_bytes());
        // The decoder reads the header up to the first data chunk: an empty one.
        png.extend_from_slice(&0u32.to_be_bytes());
        png.extend_from_slice(b"IDAT");
        png.extend_from_slice(&crc32fast::hash(b"IDAT").to_be_bytes());
        png
    }

    #[test]
    fn an_image_is_known_by_its_bytes_and_measured_from_its_header() {
        let info = check_image(&png_header(1200, 800), &ImageLimits::default()).unwrap();
        assert_eq!(
            info,
            ImageInfo {
                media_type: "image/png",
                width: 1200,
                height: 800
            }
        );
        assert_eq!(sniff_image(b"\xff\xd8\xff\xe0rest"), Some("image/jpeg"));
        assert_eq!(sniff_image(b"II*\0rest"), Some("image/tiff"));
        assert_eq!(sniff_image(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff_image(b"RIFF\0\0\0\0WAVEfmt "), None);
    }

    #[test]
    fn a_30000_square_image_is_too_large_before_any_pixel_is_read() {
        let error = check_image(&png_header(30_000, 30_000), &ImageLimits::default()).unwrap_err();
        assert_eq!(error.code(), "image_too_large", "{error}");
        assert!(error.to_string().contains("30000 × 30000"), "{error}");
    }

    #[test]
    fn bytes_that_are_no_image_or_a_broken_one_are_refused() {
        let error = check_image(b"%PDF-1.7 not an image", &ImageLimits::default()).unwrap_err();
        assert_eq!(error.code(), "content_mismatch", "{error}");
        let mut broken = png_header(10, 10);
        broken[20] ^= 0xff; // the CRC no longer matches
        let error = check_image(&broken[..20], &ImageLimits::default()).unwrap_err();
        assert_eq!(error.code(), "invalid_image", "{error}");
        assert_eq!(
            check_image(b"", &ImageLimits::default())
                .unwrap_err()
                .code(),
            "empty_document"
        );
    }
}
