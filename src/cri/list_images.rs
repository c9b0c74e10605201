//! `ListImages` asked by hand and its answer decoded as it arrives.
//!
//! tonic's unary call gathers the whole encoded answer before decoding it;
//! on a node of 100,000 images that buffer (tens of MiB) lived beside the
//! decoded images and was the largest single thing at the daemon's peak.
//! Here the request goes to the channel as a plain HTTP/2 request and the
//! answer's body is read frame by frame: the 5-byte gRPC prefix, then the
//! `ListImagesResponse` field by field, each `Image` decoded (by
//! [`WireImage`]) as soon as its bytes are in and those bytes dropped (an
//! entry without an id is dropped whole: it names nothing that could be
//! removed). What is held besides the images is one partly received image
//! and one frame.
//!
//! The answer is read as tonic reads a unary answer: a `grpc-status` in the
//! headers (a trailers-only answer) or the trailers decides; without one,
//! the HTTP status does. Errors are the `tonic::Status`es tonic gives for
//! the same faults, so the client maps them as it maps every other call's
//! (refusal by gRPC code, no answer as a transport error). Exactly one
//! message is expected, of at most the client's size limit; a compressed
//! message is refused (imagegc asks for no compression).

use http_body_util::BodyExt as _;
use prost::Message as _;
use prost::bytes::Bytes;
use tonic::codegen::http;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tower::ServiceExt as _;

use super::Image;
use super::listing::WireImage;
use super::names::{Interner, Names};

/// The names of the last listing, to share with the next (see [`Interner`]).
pub(super) type Previous = std::collections::HashSet<Names, foldhash::fast::RandomState>;

/// The method's path.
const PATH: &str = "/runtime.v1.ImageService/ListImages";

/// The request: one uncompressed message of zero bytes (a
/// `ListImagesRequest` without a filter encodes to nothing).
const REQUEST: [u8; 5] = [0, 0, 0, 0, 0];

/// Calls `ListImages` on `channel` and decodes the answer as it arrives;
/// a message over `max_message` bytes is refused. Names unchanged since
/// `previous` are shared with it; the names of this listing are returned
/// for the next.
pub(super) async fn list_images(
    channel: Channel,
    max_message: usize,
    previous: Previous,
) -> Result<(Vec<Image>, Previous), Status> {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(PATH)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(Bytes::from_static(
            &REQUEST,
        ))))
        .map_err(|e| Status::internal(format!("building the ListImages request: {e}")))?;
    let response = channel
        .oneshot(request)
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?;
    let (head, mut body) = response.into_parts();
    // A trailers-only answer: the status is in the headers.
    let head_status = Status::from_header_map(&head.headers);
    if let Some(status) = &head_status
        && status.code() != Code::Ok
    {
        return Err(status.clone());
    }
    if head_status.is_none() && head.status != http::StatusCode::OK {
        return Err(from_http_status(head.status));
    }
    let mut reader = Reader::new(max_message, previous);
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(data) => reader.feed(&data)?,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    if let Some(status) = trailers.as_ref().and_then(Status::from_header_map)
        && status.code() != Code::Ok
    {
        return Err(status);
    }
    reader.finish()
}

/// A gRPC code for an HTTP status without a `grpc-status`, as gRPC maps
/// them (and tonic does).
fn from_http_status(status: http::StatusCode) -> Status {
    let code = match status {
        http::StatusCode::BAD_REQUEST => Code::Internal,
        http::StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        http::StatusCode::FORBIDDEN => Code::PermissionDenied,
        http::StatusCode::NOT_FOUND => Code::Unimplemented,
        http::StatusCode::TOO_MANY_REQUESTS
        | http::StatusCode::BAD_GATEWAY
        | http::StatusCode::SERVICE_UNAVAILABLE
        | http::StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(
        code,
        format!(
            "grpc-status header missing, mapped from HTTP status code {}",
            status.as_u16()
        ),
    )
}

/// The answer's body, decoded as it is fed: no IO, so that tests can feed
/// it any split of any bytes.
pub(super) struct Reader {
    max_message: usize,
    /// Bytes received and not yet consumed: at most an unfinished prefix,
    /// field key or image, and the rest of the last frame.
    pending: Vec<u8>,
    state: State,
    /// Whether the (one) message's prefix was read.
    message_seen: bool,
    images: Vec<Image>,
    names: Interner,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Before a message's 5-byte prefix.
    Prefix,
    /// Within a message, before a field; `left` bytes of the message to come.
    Field { left: usize },
    /// Within a field imagegc does not read: `skip` bytes of it to drop,
    /// then `left` more bytes of the message.
    Skip { skip: usize, left: usize },
}

impl Reader {
    pub(super) fn new(max_message: usize, previous: Previous) -> Self {
        Reader {
            max_message,
            pending: Vec::new(),
            state: State::Prefix,
            message_seen: false,
            images: Vec::new(),
            names: Interner::new(previous),
        }
    }

    /// Takes the next bytes of the body and decodes every image they
    /// complete.
    pub(super) fn feed(&mut self, data: &[u8]) -> Result<(), Status> {
        self.pending.extend_from_slice(data);
        let consumed = self.consume()?;
        self.pending.drain(..consumed);
        Ok(())
    }

    /// The images and their names, once the body has ended: an error
    /// unless exactly one whole message came.
    pub(super) fn finish(self) -> Result<(Vec<Image>, Previous), Status> {
        if !matches!(self.state, State::Prefix) || !self.pending.is_empty() {
            return Err(Status::internal("Unexpected EOF decoding stream."));
        }
        if !self.message_seen {
            return Err(Status::internal("Missing response message."));
        }
        // Not shrunk to fit: that would copy every image once more, at
        // the moment all of them are held.
        Ok((self.images, self.names.into_names()))
    }

    /// Decodes what `pending` holds; returns how many of its bytes are done
    /// with.
    fn consume(&mut self) -> Result<usize, Status> {
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            match self.state {
                State::Prefix => {
                    let Some(prefix) = rest.get(..5) else { return Ok(at) };
                    match prefix[0] {
                        0 => {}
                        1 => {
                            return Err(Status::internal(
                                "the runtime compressed its ListImages answer, which imagegc does not ask for nor read",
                            ));
                        }
                        flag => {
                            return Err(Status::internal(format!(
                                "protocol error: received message with invalid compression flag: {flag}"
                            )));
                        }
                    }
                    if self.message_seen {
                        return Err(Status::internal(
                            "protocol error: more than one message in the ListImages answer",
                        ));
                    }
                    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
                    if len > self.max_message {
                        return Err(Status::out_of_range(format!(
                            "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                            self.max_message
                        )));
                    }
                    self.message_seen = true;
                    at += 5;
                    self.state = State::Field { left: len };
                }
                State::Field { left: 0 } => self.state = State::Prefix,
                State::Field { left } => {
                    // The field's bytes that are here, never past the message.
                    let here = &rest[..rest.len().min(left)];
                    let whole = here.len() == left;
                    let Some(field) = field(here)? else {
                        return if whole { Err(truncated()) } else { Ok(at) };
                    };
                    match field {
                        Field::Image { start, len } => {
                            let end = start
                                .checked_add(len)
                                .filter(|end| *end <= left)
                                .ok_or_else(truncated)?;
                            let Some(bytes) = here.get(start..end) else {
                                return Ok(at);
                            };
                            let image = WireImage::decode(bytes).map_err(|e| Status::internal(e.to_string()))?;
                            // An entry without an id is dropped here, as
                            // `merge_listings` would drop it: an answer of
                            // millions of them holds nothing meanwhile.
                            if image.has_id() {
                                self.images.push(image.into_image(&mut self.names));
                            }
                            at += end;
                            self.state = State::Field { left: left - end };
                        }
                        Field::Other { start, len } => {
                            let end = start
                                .checked_add(len)
                                .filter(|end| *end <= left)
                                .ok_or_else(truncated)?;
                            at += start;
                            self.state = State::Skip {
                                skip: len,
                                left: left - end,
                            };
                        }
                    }
                }
                State::Skip { skip, left } => {
                    let n = rest.len().min(skip);
                    at += n;
                    if n < skip {
                        self.state = State::Skip { skip: skip - n, left };
                        return Ok(at);
                    }
                    self.state = State::Field { left };
                }
            }
        }
    }
}

/// Where a field's value lies, from its start.
enum Field {
    /// An `Image` (field 1): `len` bytes from `start`.
    Image { start: usize, len: usize },
    /// Any other field, skipped: `len` bytes from `start`.
    Other { start: usize, len: usize },
}

/// The field at the start of `bytes` (key, and length for a length-
/// delimited one); `None` when `bytes` end before that is known.
fn field(bytes: &[u8]) -> Result<Option<Field>, Status> {
    let Some((key, key_len)) = varint(bytes)? else {
        return Ok(None);
    };
    let tag = key >> 3;
    if tag == 0 || tag > u64::from(u32::MAX >> 3) {
        return Err(Status::internal(format!(
            "failed to decode Protobuf message: invalid tag value: {tag}"
        )));
    }
    let value = &bytes[key_len..];
    let other = |len: usize| Ok(Some(Field::Other { start: key_len, len }));
    match (tag, key & 7) {
        (1, 2) => match varint(value)? {
            None => Ok(None),
            Some((len, len_len)) => Ok(Some(Field::Image {
                start: key_len + len_len,
                len: usize::try_from(len).map_err(|_| truncated())?,
            })),
        },
        (1, wire) => Err(Status::internal(format!(
            "failed to decode Protobuf message: ListImagesResponse.images: invalid wire type {wire}"
        ))),
        (_, 0) => match varint(value)? {
            None => Ok(None),
            Some((_, len)) => other(len),
        },
        (_, 1) => other(8),
        (_, 5) => other(4),
        (_, 2) => match varint(value)? {
            None => Ok(None),
            Some((len, len_len)) => Ok(Some(Field::Other {
                start: key_len + len_len,
                len: usize::try_from(len).map_err(|_| truncated())?,
            })),
        },
        (_, wire) => Err(Status::internal(format!(
            "failed to decode Protobuf message: unsupported wire type {wire}"
        ))),
    }
}

/// A varint at the start of `bytes` and its length; `None` when `bytes`
/// end within it.
fn varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, Status> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i == 9 && byte > 1 {
                break;
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() < 10 {
        Ok(None)
    } else {
        Err(Status::internal("failed to decode Protobuf message: invalid varint"))
    }
}

fn truncated() -> Status {
    Status::internal("failed to decode Protobuf message: ListImagesResponse: buffer underflow")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::listing::ListedImages;
    use crate::cri::proto;
    use prost::Message;

    const MAX: usize = 1 << 20;

    /// An answer of three images with fields imagegc skips (uid, username,
    /// a spec with annotations) and, between them, top-level fields of
    /// every wire type the reader skips.
    fn answer() -> Vec<u8> {
        let image = |n: u32, tags: usize| proto::Image {
            id: format!("sha256:{n:064x}"),
            repo_tags: (0..tags)
                .map(|t| format!("registry.example.com/app-{n}:v{t}"))
                .collect(),
            repo_digests: vec![format!("registry.example.com/app-{n}@sha256:{:064x}", n + 100)],
            size: 1 << (20 + n),
            uid: Some(proto::Int64Value { value: 7 }),
            username: "nobody".to_string(),
            spec: Some(proto::ImageSpec {
                image: "app".to_string(),
                annotations: [("k".to_string(), "v".repeat(300))].into(),
                ..Default::default()
            }),
            pinned: n == 2,
        };
        let mut bytes = proto::ListImagesResponse {
            images: vec![image(0, 3)],
        }
        .encode_to_vec();
        // Field 7 varint (a multi-byte one), 8 fixed64, 9 length-delimited
        // (200 bytes), 10 fixed32: none of them is read.
        bytes.extend([7 << 3, 0x96, 0x01]);
        bytes.extend([(8 << 3) | 1]);
        bytes.extend([0xab; 8]);
        bytes.extend([(9 << 3) | 2, 0xc8, 0x01]);
        bytes.extend([0xcd; 200]);
        bytes.extend([(10 << 3) | 5, 1, 2, 3, 4]);
        bytes.extend(
            proto::ListImagesResponse {
                images: vec![image(1, 0), image(2, 5)],
            }
            .encode_to_vec(),
        );
        bytes
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut body = vec![0];
        body.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend(message);
        body
    }

    fn read(parts: &[&[u8]]) -> Result<Vec<Image>, Status> {
        let mut reader = Reader::new(MAX, Previous::default());
        for part in parts {
            reader.feed(part)?;
        }
        Ok(reader.finish()?.0)
    }

    #[test]
    fn an_answer_split_anywhere_reads_as_the_whole_message_decoded_at_once() {
        let message = answer();
        let expected = ListedImages::decode(message.as_slice()).unwrap().0;
        assert_eq!(expected.len(), 3);
        assert_eq!(expected[2].repo_tags.len(), 5);
        assert!(expected[2].pinned);
        let body = framed(&message);
        assert_eq!(read(&[&body]).unwrap(), expected);
        for cut in 0..=body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(read(&[a, b]).unwrap(), expected, "split at {cut}");
        }
        // Byte by byte, and in every pair of cuts three bytes apart.
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(read(&bytes).unwrap(), expected);
        for cut in 0..body.len().saturating_sub(3) {
            let parts = [&body[..cut], &body[cut..cut + 3], &body[cut + 3..]];
            assert_eq!(read(&parts).unwrap(), expected, "cuts at {cut}");
        }
    }

    #[test]
    fn entries_without_an_id_are_dropped_as_they_are_decoded_names_and_all() {
        // 10,000 entries without an id, each with a tag of its own, around
        // one real image.
        let empty = |n: u32| proto::Image {
            repo_tags: vec![format!("registry.example.com/ghost-{n}:v1")],
            size: 1,
            ..Default::default()
        };
        let mut images: Vec<proto::Image> = (0..10_000).map(empty).collect();
        images.insert(
            5_000,
            proto::Image {
                id: format!("sha256:{:064x}", 1),
                repo_tags: vec!["registry.example.com/app:v1".to_string()],
                ..Default::default()
            },
        );
        let message = proto::ListImagesResponse { images }.encode_to_vec();
        let mut reader = Reader::new(MAX, Previous::default());
        for chunk in framed(&message).chunks(4096) {
            reader.feed(chunk).unwrap();
        }
        let (images, names) = reader.finish().unwrap();
        assert_eq!(images.len(), 1, "only the image with an id is held");
        assert_eq!(images[0].id, format!("sha256:{:064x}", 1));
        assert!(images.capacity() < 16, "room for {} images", images.capacity());
        assert!(names.len() <= 2, "{} names kept for the next listing", names.len());
    }

    #[test]
    fn an_empty_listing_is_one_empty_message() {
        assert_eq!(read(&[&framed(&[])]).unwrap(), []);
        let err = read(&[]).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(err.message().contains("Missing response message"), "{err}");
    }

    #[test]
    fn a_body_cut_anywhere_short_of_its_end_is_an_error() {
        let body = framed(&answer());
        for cut in 1..body.len() {
            let err = read(&[&body[..cut]]).unwrap_err();
            assert_eq!(err.code(), Code::Internal, "cut at {cut}: {err}");
        }
    }

    #[test]
    fn a_message_whose_fields_run_past_its_end_is_an_error() {
        let message = answer();
        // The prefix says the message is shorter than its fields: the
        // image that straddles the end is not read from what follows.
        for len in 1..message.len() {
            let mut body = vec![0];
            body.extend(u32::try_from(len).unwrap().to_be_bytes());
            body.extend(&message);
            let whole = ListedImages::decode(&message[..len]);
            let streamed = read(&[&body]);
            assert!(streamed.is_err(), "length {len}");
            // Where prost reads the cut message, so does the reader (the
            // bytes after it are what fails).
            if let Ok(whole) = whole {
                let mut reader = Reader::new(MAX, Previous::default());
                reader.feed(&body[..5 + len]).unwrap();
                assert_eq!(reader.finish().unwrap().0, whole.0, "length {len}");
            }
        }
    }

    #[test]
    fn a_second_message_is_refused() {
        let one = framed(&answer());
        let two = [one.as_slice(), one.as_slice()].concat();
        let err = read(&[&two]).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(err.message().contains("more than one message"), "{err}");
        // Even an empty second one.
        let err = read(&[&one, &framed(&[])]).unwrap_err();
        assert!(err.message().contains("more than one message"), "{err}");
    }

    #[test]
    fn a_message_over_the_limit_is_refused_from_its_prefix() {
        let mut reader = Reader::new(100, Previous::default());
        let mut prefix = vec![0];
        prefix.extend(101u32.to_be_bytes());
        let err = reader.feed(&prefix).unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange);
        assert!(err.message().contains("101 bytes"), "{err}");
        // At the limit it is read.
        let message = proto::ListImagesResponse {
            images: vec![proto::Image {
                id: "x".repeat(96),
                ..Default::default()
            }],
        }
        .encode_to_vec();
        assert_eq!(message.len(), 100);
        let mut reader = Reader::new(100, Previous::default());
        reader.feed(&framed(&message)).unwrap();
        assert_eq!(reader.finish().unwrap().0[0].id, "x".repeat(96));
    }

    #[test]
    fn a_compressed_message_is_refused() {
        let mut body = framed(&answer());
        body[0] = 1;
        let err = read(&[&body[..5]]).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(err.message().contains("compressed"), "{err}");
        body[0] = 2;
        let err = read(&[&body]).unwrap_err();
        assert!(err.message().contains("invalid compression flag: 2"), "{err}");
    }

    #[test]
    fn malformed_fields_are_errors_not_panics() {
        for message in [
            vec![0x00],                                                             // tag 0
            vec![(1 << 3)],                                                         // images as a varint
            vec![(3 << 3) | 3],                                                     // a group
            vec![0x8a; 11],                                                         // a varint too long
            vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], // an image of 2^64-1 bytes
            vec![0x0a, 0x02, 0x08, 0x80],                                           // an image whose own varint is cut
        ] {
            let err = read(&[&framed(&message)]).unwrap_err();
            assert_eq!(err.code(), Code::Internal, "{message:?}: {err}");
        }
    }

    /// What a scripted server answers: the HTTP status, the headers, then
    /// body frames.
    #[derive(Clone)]
    struct Scripted {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        frames: Vec<Frame>,
    }

    #[derive(Clone)]
    enum Frame {
        Data(Vec<u8>),
        Trailers(Vec<(&'static str, &'static str)>),
    }

    impl tonic::server::NamedService for Scripted {
        const NAME: &'static str = "runtime.v1.ImageService";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Scripted {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
            assert_eq!(request.uri().path(), PATH);
            let map = |pairs: &[(&'static str, &'static str)]| {
                let mut headers = http::HeaderMap::new();
                for (k, v) in pairs {
                    headers.insert(*k, http::HeaderValue::from_static(v));
                }
                headers
            };
            let frames: Vec<Result<hyper::body::Frame<Bytes>, Status>> = self
                .frames
                .iter()
                .map(|frame| {
                    Ok(match frame {
                        Frame::Data(bytes) => hyper::body::Frame::data(Bytes::from(bytes.clone())),
                        Frame::Trailers(pairs) => hyper::body::Frame::trailers(map(pairs)),
                    })
                })
                .collect();
            let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
            let mut response = http::Response::new(tonic::body::Body::new(body));
            *response.status_mut() = http::StatusCode::from_u16(self.status).unwrap();
            *response.headers_mut() = map(&self.headers);
            std::future::ready(Ok(response))
        }
    }

    /// `ListImages` through the client against a server answering `script`.
    async fn listed_by(script: Scripted) -> Result<Vec<Image>, crate::cri::RuntimeError> {
        use crate::cri::Runtime as _;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("scripted.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(script)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let client = crate::cri::connect(
            &format!("unix://{}", socket.display()),
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        let listed = client.list_images().await;
        server.abort();
        listed
    }

    const GRPC: (&str, &str) = ("content-type", "application/grpc");
    const OK: (&str, &str) = ("grpc-status", "0");

    fn code(err: &crate::cri::RuntimeError) -> Code {
        match err {
            crate::cri::RuntimeError::Rpc { status, .. } => status.code(),
            other => panic!("not an RPC error: {other}"),
        }
    }

    #[tokio::test]
    async fn the_client_reads_an_answer_sent_in_pieces_and_its_trailers() {
        let body = framed(&answer());
        let expected = ListedImages::decode(&body[5..]).unwrap().0;
        let frames = body.chunks(7).map(|c| Frame::Data(c.to_vec()));
        let script = Scripted {
            status: 200,
            headers: vec![GRPC],
            frames: frames.chain([Frame::Trailers(vec![OK])]).collect(),
        };
        let mut listed = listed_by(script).await.unwrap();
        for image in &mut listed {
            assert!(image.id.starts_with("sha256:"));
        }
        assert_eq!(listed, expected);
    }

    #[tokio::test]
    async fn a_trailers_only_refusal_keeps_its_code_and_message() {
        let script = Scripted {
            status: 200,
            headers: vec![GRPC, ("grpc-status", "7"), ("grpc-message", "not allowed")],
            frames: vec![],
        };
        let err = listed_by(script).await.unwrap_err();
        assert_eq!(code(&err), Code::PermissionDenied, "{err}");
        assert!(err.to_string().contains("not allowed"), "{err}");
        assert!(err.to_string().contains("ListImages"), "{err}");
    }

    #[tokio::test]
    async fn an_error_status_after_the_data_wins_over_the_data() {
        let script = Scripted {
            status: 200,
            headers: vec![GRPC],
            frames: vec![
                Frame::Data(framed(&answer())),
                Frame::Trailers(vec![("grpc-status", "13"), ("grpc-message", "listing failed")]),
            ],
        };
        let err = listed_by(script).await.unwrap_err();
        assert_eq!(code(&err), Code::Internal, "{err}");
        assert!(err.to_string().contains("listing failed"), "{err}");
        // Unavailable after data is a runtime that went away, as for any call.
        let script = Scripted {
            status: 200,
            headers: vec![GRPC],
            frames: vec![
                Frame::Data(framed(&answer())),
                Frame::Trailers(vec![("grpc-status", "14")]),
            ],
        };
        let err = listed_by(script).await.unwrap_err();
        assert!(matches!(err, crate::cri::RuntimeError::Connect { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_truncated_body_and_a_bare_http_error_are_errors() {
        let body = framed(&answer());
        let script = Scripted {
            status: 200,
            headers: vec![GRPC],
            frames: vec![Frame::Data(body[..body.len() - 1].to_vec()), Frame::Trailers(vec![OK])],
        };
        let err = listed_by(script).await.unwrap_err();
        assert_eq!(code(&err), Code::Internal, "{err}");
        let script = Scripted {
            status: 404,
            headers: vec![],
            frames: vec![Frame::Data(b"not here".to_vec())],
        };
        let err = listed_by(script).await.unwrap_err();
        assert_eq!(code(&err), Code::Unimplemented, "{err}");
    }

    #[tokio::test]
    async fn a_compressed_answer_is_refused() {
        let mut body = framed(&answer());
        body[0] = 1;
        let script = Scripted {
            status: 200,
            headers: vec![GRPC, ("grpc-encoding", "gzip")],
            frames: vec![Frame::Data(body), Frame::Trailers(vec![OK])],
        };
        let err = listed_by(script).await.unwrap_err();
        assert_eq!(code(&err), Code::Internal, "{err}");
        assert!(err.to_string().contains("compressed"), "{err}");
    }
}
