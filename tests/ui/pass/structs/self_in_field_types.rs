//! `Self` in owned and unowned field types (also of a generic struct): the generated init and
//! view structs reuse the field types with `Self` replaced by the struct's type, also where a
//! path starts with it (`[u8; Self::LEN]`, which the view struct, generic over its borrow, could
//! not take: "generic `Self` types are currently not permitted in anonymous constants").

#[kvown::guarded(into_init)]
#[derive(Debug, Clone, Default)]
pub struct Node<T> {
    #[owned_by(grow)]
    parent: Option<Box<Self>>,
    children: Vec<Self>,
    tag: T,
}

#[kvown::owner]
pub fn grow<T: Clone>(node: &mut Node<T>) {
    let parent = node.clone();
    node.set_parent(owner, Some(Box::new(parent)));
}

#[kvown::guarded]
#[allow(unused_braces)] // the braces are the case: a block (without items) in an array length
pub struct Frame {
    #[owned_by(fill)]
    head: [u8; Self::LEN],
    tail: [u16; { Self::LEN / 2 }],
}

impl Frame {
    pub const LEN: usize = 4;
}

#[kvown::owner]
pub fn fill(frame: &mut Frame) {
    frame.head_mut(owner)[0] = 1;
}

#[test]
fn compiles_and_runs() {
    let mut frame = Frame::from(FrameInit {
        head: [0; Frame::LEN],
        tail: [0; 2],
    });
    fill(&mut frame);
    frame.fields_mut().tail[1] = 7;
    assert_eq!((frame.head()[0], frame.fields_mut().tail[1]), (1, 7));

    let mut node = Node::from(NodeInit {
        parent: None,
        children: vec![Node::default()],
        tag: 1u8,
    });
    node.fields_mut().children.push(Node::default());
    grow(&mut node);
    assert_eq!(node.parent().as_ref().map(|p| p.children.len()), Some(2));
    let init: NodeInit<u8> = node.into_init();
    assert_eq!(init.children.len(), 2);
}
